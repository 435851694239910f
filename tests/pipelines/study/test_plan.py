"""Study files -> checked graphs, without running anything: references, instances per
dataset, order, fingerprints that change exactly where a setting changes, and one clear
message for each thing a user can get wrong, before anything runs."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rexeval.storage import location
from rexeval.pipelines.study.config import StudyError, load_study
from rexeval.pipelines.study.plan import build_plan, status_of

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "pipelines" / "sample"


def study_dict(**steps) -> dict:
    base = {
        "name": "t",
        "datasets": {"a": {"inputs": [str(SAMPLE / "reviews.jsonl")], "vars": {"k": 3}},
                     "b": {"inputs": [str(SAMPLE / "reviews_noisy.jsonl")]}},
        "steps": {
            "ingest": {"job": "ingest", "with": {"inputs": "{dataset.inputs}"}},
            "split": {"job": "split", "with": {"input": "{ingest}", "min_interactions": "{dataset.k}"},
                      "datasets": ["a"]},
            "stats": {"job": "stats", "with": {"input": "{split}", "name": "{dataset}"}, "datasets": ["a"]},
            "clusters": {"job": "cluster", "per_dataset": False,
                         "with": {"input": "{ingest@a}", "method": "extra"}},
        },
    }
    base["steps"].update(steps)
    return base


def plan_of(tmp_path, data: dict, out=None):
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return build_plan(load_study(f), f, out or tmp_path / "out")


def problems(tmp_path, data: dict) -> str:
    with pytest.raises(StudyError) as err:
        plan_of(tmp_path, data)
    return str(err.value)


def test_instances_references_and_order(tmp_path):
    plan = plan_of(tmp_path, study_dict())
    out = tmp_path / "out"
    assert plan.order == ["ingest@a", "ingest@b", "split@a", "stats@a", "clusters"]
    split, stats, clusters = (plan.instances[k] for k in ("split@a", "stats@a", "clusters"))
    assert split.settings["input"] == str(out / "a" / "ingest") and split.settings["min_interactions"] == 3
    assert split.out == location(out / "a" / "split") and split.deps == {"ingest@a"}
    assert stats.settings["name"] == "a" and stats.deps == {"split@a"}
    assert clusters.out == location(out / "clusters") and clusters.deps == {"ingest@a"}
    assert clusters.settings["profile"] == "local"  # the study's profile, where the job takes one
    assert [Path(p).resolve() for p in plan.instances["ingest@b"].settings["inputs"]] == \
        [SAMPLE / "reviews_noisy.jsonl"]


def test_a_dataset_file_inside_the_working_dir_is_named_relative_to_it(tmp_path, monkeypatch):
    """Inside the working dir (what a Ray job ships to every node, unpacked under a folder
    of each node's own) a dataset file is named relative to it, so it names the same file,
    and the rows ingested from it record the same `source`, whichever node runs the
    step; a file outside it stays absolute; a URI stays as written."""
    (tmp_path / "work" / "data").mkdir(parents=True)
    (tmp_path / "work" / "data" / "r.jsonl").write_text("{}")
    (tmp_path / "elsewhere.jsonl").write_text("{}")
    data = study_dict()
    data["datasets"]["a"]["inputs"] = ["data/r.jsonl", "../elsewhere.jsonl", "s3://bucket/r.jsonl"]
    f = tmp_path / "work" / "study.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.chdir(tmp_path / "work")
    assert load_study(f).datasets["a"].inputs == [
        "data/r.jsonl", str(tmp_path / "elsewhere.jsonl"), "s3://bucket/r.jsonl"]
    monkeypatch.chdir(tmp_path / "work" / "data")  # the study file lies above the working dir
    assert load_study(f).datasets["a"].inputs[0] == "r.jsonl"


def test_list_references_env_defaults_and_paths_relative_to_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("REXEVAL_TEST_DATA", raising=False)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "r.jsonl").write_text((SAMPLE / "reviews.jsonl").read_text())
    data = study_dict(all_ingests={"job": "judge_winrate", "per_dataset": False,
                                   "with": {"runs": "{ingest@*}", "baseline_label": "{here}/x"}})
    data["datasets"]["b"]["inputs"] = ["${REXEVAL_TEST_DATA:-data}/r.jsonl"]
    plan = plan_of(tmp_path, data)
    assert plan.instances["ingest@b"].settings["inputs"] == [str(tmp_path / "data" / "r.jsonl")]
    w = plan.instances["all_ingests"]
    assert w.settings["runs"] == [str(tmp_path / "out" / "a" / "ingest"), str(tmp_path / "out" / "b" / "ingest")]
    assert w.deps == {"ingest@a", "ingest@b"} and w.settings["baseline_label"] == f"{tmp_path}/x"


def test_fingerprints_change_for_the_changed_step_and_downstream_only(tmp_path):
    before = plan_of(tmp_path, study_dict())
    data = study_dict()
    data["steps"]["split"]["with"]["train"] = 0.7
    after = plan_of(tmp_path, data)
    changed = {k for k in before.order if before.instances[k].fingerprint != after.instances[k].fingerprint}
    assert changed == {"split@a", "stats@a"}
    # The state file's view: what completed with the old fingerprints, and why each re-runs.
    state = {"steps": {k: {"status": "complete", "fingerprint": i.fingerprint, "settings": i.settings}
                       for k, i in before.instances.items()}}
    for i in before.instances.values():
        i.out.mkdir(parents=True, exist_ok=True)
    status = status_of(after, state)
    assert {k for k, (what, _) in status.items() if what == "run"} == {"split@a", "stats@a"}
    assert status["split@a"][1] == "settings changed: train"
    assert status["stats@a"][1] == "upstream changes: split@a"
    assert status["ingest@a"][0] == "done"


def test_an_edited_input_file_reruns_its_readers(tmp_path):
    data = study_dict()
    f = tmp_path / "r.jsonl"
    f.write_text((SAMPLE / "reviews.jsonl").read_text())
    data["datasets"]["a"]["inputs"] = [str(f)]
    before = plan_of(tmp_path, data)
    f.write_text(f.read_text() + "\n")
    after = plan_of(tmp_path, data)
    changed = {k for k in before.order if before.instances[k].fingerprint != after.instances[k].fingerprint}
    assert changed == {"ingest@a", "split@a", "stats@a", "clusters"}


def test_the_same_inputs_under_another_folder_keep_every_fingerprint(tmp_path):
    """What a driver on another node sees: the submitted working dir unpacked under
    another folder, its files written anew (other mtimes). Nothing is to be re-run."""
    import os

    fingerprints = []
    for where, mtime in (("node0/pkg", 1_700_000_000), ("node1/other/pkg", 1_800_000_000)):
        folder = tmp_path / where
        folder.mkdir(parents=True)
        data = study_dict()
        for ds, name in (("a", "reviews.jsonl"), ("b", "reviews_noisy.jsonl")):
            f = folder / name
            f.write_bytes((SAMPLE / name).read_bytes())
            os.utime(f, (mtime, mtime))
            data["datasets"][ds]["inputs"] = [str(f)]
        plan = plan_of(tmp_path, data)  # the same study folder: the out URI of a cluster study
        fingerprints.append({k: plan.instances[k].fingerprint for k in plan.order})
    assert fingerprints[0] == fingerprints[1]


def test_a_file_an_upstream_step_writes_keeps_its_readers_fingerprint(tmp_path):
    """A step that reads a file inside the study's folder (an upstream step's output)
    is fingerprinted by its upstream, not by the file: the file appearing when the
    upstream runs must not make a second run re-run the reader."""
    data = study_dict(clusters={"job": "cluster", "per_dataset": False,
                                "with": {"input": "{ingest@a}/reviews/part-00000.parquet", "method": "extra"}})
    before = plan_of(tmp_path, data)
    written = tmp_path / "out" / "a" / "ingest" / "reviews" / "part-00000.parquet"
    written.parent.mkdir(parents=True)
    written.write_bytes((SAMPLE / "reviews.jsonl").read_bytes())  # any bytes: what the upstream wrote
    after = plan_of(tmp_path, data)
    assert before.instances["clusters"].fingerprint == after.instances["clusters"].fingerprint


@pytest.mark.parametrize("mutate,expected", [
    (lambda d: d.update(stepz={}), "stepz: unknown key"),
    (lambda d: d["steps"]["split"].update(wth={}), "steps.split.wth: unknown key"),
    (lambda d: d["steps"]["split"]["with"].update(trian=0.7), "steps.split.with (dataset a).trian: unknown key"),
    (lambda d: d["steps"]["split"]["with"].update(method="random"), "steps.split.with (dataset a).method"),
    (lambda d: d["steps"]["split"].update(job="spilt"), "steps.split.job: unknown job 'spilt'"),
    (lambda d: d["steps"]["split"]["with"].update(input="{ingets}"), "steps.split (dataset a).with.input: "
                                                                     "{ingets} names no step"),
    (lambda d: d["steps"]["clusters"]["with"].update(input="{ingest}"), "ingest runs per dataset; name one"),
    (lambda d: d["steps"]["split"].update(datasets=["c"]), "steps.split.datasets: no dataset 'c'"),
    (lambda d: d["datasets"]["a"].update(inputs=["/nope/reviews.jsonl"]),
     "datasets.a.inputs: /nope/reviews.jsonl does not exist"),
    (lambda d: d["steps"]["split"]["with"].update(out="/tmp/x"), "steps.split.with.out: the study sets"),
    (lambda d: d["steps"]["ingest"]["with"].update(category="{dataset.nothing}"),
     "dataset a has no 'nothing' (add it under vars)"),
    (lambda d: d["steps"].update(triplets={"job": "extract", "with": {"input": "{ingest}",
                                                                      "models": {"llm": None}}}),
     "steps.triplets: job extract needs a 'llm' model and profile 'local' has none"),
])
def test_each_mistake_is_one_clear_message_before_anything_runs(tmp_path, mutate, expected):
    data = study_dict()
    mutate(data)
    msg = problems(tmp_path, data)
    assert expected in msg, msg
    assert not (tmp_path / "out").exists()


def test_a_cycle_is_named(tmp_path):
    data = study_dict(x={"job": "stats", "with": {"input": "{y}"}, "datasets": ["a"]},
                      y={"job": "stats", "with": {"input": "{x}"}, "datasets": ["a"]})
    assert "a cycle: x@a -> y@a -> x@a" in problems(tmp_path, data)


def test_several_problems_are_reported_together(tmp_path):
    data = study_dict()
    data["steps"]["split"]["job"] = "spilt"
    data["steps"]["stats"]["job"] = "statz"
    msg = problems(tmp_path, data)
    assert "2 problems" in msg and "'spilt'" in msg and "'statz'" in msg


def test_shipped_studies_are_valid(tmp_path, monkeypatch):
    """Every studies/*.yaml plans without a problem once its data exist (empty stand-ins
    under $REXEVAL_DATA / $REXEVAL_SHARED here): settings, references, model roles."""
    monkeypatch.setenv("REXEVAL_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("REXEVAL_SHARED", str(tmp_path / "shared"))
    shipped = sorted((REPO / "studies").glob("*.yaml"))
    assert {f.name for f in shipped} >= {"local.yaml", "seed000.yaml", "seed001.yaml", "seed002.yaml", "seed003.yaml",
                                       "seed004.yaml"}
    for f in shipped:
        study = load_study(f)
        for ds in study.datasets.values():
            paths = [v for v in ds.vars.values() if isinstance(v, str) and v.startswith(str(tmp_path))]
            for p in ds.inputs + ds.meta + paths:
                if Path(p).is_relative_to(tmp_path):
                    Path(p).parent.mkdir(parents=True, exist_ok=True)
                    Path(p).touch()
        plan = build_plan(study, f, tmp_path / "out" / f.stem)
        assert plan.order, f


def test_vars_set_and_when_turn_steps_and_their_readers_off(tmp_path):
    data = study_dict(triplets={"job": "extract", "when": "{vars.llm}", "datasets": ["a"],
                                "with": {"input": "{ingest}", "limit": "{vars.n}"}},
                      truth={"job": "ground_truth", "datasets": ["a"], "with": {"input": "{triplets}"}})
    data["vars"] = {"llm": True, "n": 4}
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    on = build_plan(load_study(f), f, tmp_path / "out")
    assert on.instances["triplets@a"].settings["limit"] == 4 and not on.off
    off = build_plan(load_study(f, {"llm": False, "n": 0}), f, tmp_path / "out")
    assert off.off == {"triplets@a": "off (when: {vars.llm})", "truth@a": "off: needs triplets@a"}
    assert "triplets@a" not in off.order and "ingest@a" in off.order
    with pytest.raises(StudyError, match="--set lmm: the study has no such var"):
        load_study(f, {"lmm": False})
    data["steps"]["split"]["with"]["min_interactions"] = "{vars.nope}"
    assert "{vars.nope}: no var 'nope'" in problems(tmp_path, data)


def test_expscore_steps_get_the_study_models_and_need_an_encoder(tmp_path):
    """ExpScore's relevance factor needs the `sts` encoder: a study's `models:` reaches the
    job (so its override is the encoder used), and a profile without one is refused
    before anything runs unless `embedder:` names one."""
    from rexeval.pipelines.expscore.pipeline import _encoder_ref
    from rexeval.pipelines.core.study_registry import build_config

    rated = {"inputs": [str(SAMPLE / "reviews.jsonl")], "reviews": "{ingest}"}
    data = study_dict(expscore={"job": "expscore_train", "datasets": ["a"], "with": rated})
    mine, other = tmp_path / "my-encoder", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    data["models"] = {"sts": str(mine)}
    plan = plan_of(tmp_path, data)
    inst = plan.instances["expscore@a"]
    assert inst.settings["models"] == {"sts": str(mine)} and inst.deps == {"ingest@a"}
    assert _encoder_ref(build_config(inst.job, inst.settings)) == str(mine)
    data["models"] = {"sts": None}
    assert "job expscore_train needs a 'sts' model" in problems(tmp_path, data)
    data["steps"]["expscore"]["with"] = {**rated, "embedder": str(other)}
    assert plan_of(tmp_path, data).instances["expscore@a"].job.name == "expscore_train"
    # A model path with nothing there is refused before anything runs (issue 45).
    data["models"] = {"sts": str(tmp_path / "missing-encoder")}
    data["steps"]["expscore"]["with"] = rated
    assert f"the 'sts' model: no model at {tmp_path / 'missing-encoder'}" in problems(tmp_path, data)


def test_expscore_folder_key_is_unchanged_without_models():
    """`models` joined ExpScore's settings later: without it, a job folder's settings (and
    so its hash) are what they were, so existing outputs are not refused."""
    from rexeval.pipelines.expscore.config import ExpScoreTrainConfig

    cfg = ExpScoreTrainConfig(inputs=["r.jsonl"], out="o", reviews="rev")
    before = {"batch_size", "device", "embedder", "features_column", "head", "id_column", "inputs", "item_column",
              "l2", "language", "languagetool", "lr", "max_epochs", "max_reviews_per_item", "out", "patience",
              "profile", "rating_column", "rating_max", "rating_min", "ray", "ray_min_rows", "repetition_n",
              "reviews", "reviews_column", "seed", "test_fraction", "text_column"}  # the fields of 0bb0a88
    assert set(cfg.recorded()) == before
    assert ExpScoreTrainConfig(inputs=["r.jsonl"], out="o", models={"sts": "/e"}).recorded()["models"] == {"sts": "/e"}


def test_missing_files_a_step_reads_are_found_before_anything_runs(tmp_path):
    """A ratings file or a ground truth named outside the study's folder that is not there
    is a problem of the plan (named by step, setting and dataset), not a failure hours
    into the run; steps' own outputs, `none` and URLs are not checked."""
    rated = tmp_path / "rated.jsonl"
    data = study_dict(
        expscore={"job": "expscore_train", "datasets": ["a"],
                  "with": {"inputs": [str(rated)], "reviews": "{ingest}", "languagetool": "http://127.0.0.1:1"}},
        scored={"job": "expscore_score", "datasets": ["a"],
                "with": {"inputs": ["{ingest}"], "model": str(tmp_path / "scorer"),
                         "languagetool": str(tmp_path / "lt")}},
        star={"job": "star_build", "datasets": ["a"],
              "with": {"statements": "{ingest}", "clusters": "none", "reviews": str(tmp_path / "gone")}},
        # `model` names a method here, not a folder: this job's config does not declare it read
        generator={"job": "generate_train", "datasets": ["a"], "with": {"data": "{split}", "model": "nrt",
                                                                         "target": "review"}})
    msg = problems(tmp_path, data)
    assert "4 problems" in msg
    assert f"steps.expscore.with.inputs (dataset a): {rated} does not exist" in msg
    assert f"steps.star.with.reviews (dataset a): {tmp_path / 'gone'} does not exist" in msg
    assert f"steps.scored.with.model (dataset a): {tmp_path / 'scorer'} does not exist" in msg
    assert f"steps.scored.with.languagetool (dataset a): {tmp_path / 'lt'} does not exist" in msg
    rated.write_text("")
    for folder in ("gone", "scorer", "lt"):
        (tmp_path / folder).mkdir()
    plan = plan_of(tmp_path, data)
    assert {"expscore@a", "scored@a", "star@a", "generator@a"} <= set(plan.order)


@pytest.mark.parametrize("step, expected", [
    ({"job": "evaluate", "with": {"explanations": ["{ingest}"], "metrics": ["bertscore", "sts", "bleu", "rouge"]}},
     "steps.x.with (dataset a).metrics: unknown metric or family 'bleu'; did you mean"),
    ({"job": "evaluate", "with": {"explanations": ["{ingest}"], "skip": ["questeval_p"]}},
     "steps.x.with (dataset a).skip: 'questeval_p' is now 'questeval_f1_p'"),
    ({"job": "evaluate", "with": {"explanations": ["{ingest}"], "extract": True}},
     "steps.x.with (dataset a): extract needs a domain"),
    ({"job": "evaluate", "with": {"explanations": ["{ingest}"], "nli_service": "localhost:8000"}},
     "nli_service must be auto, none, serve:APP or an http(s) URL"),
    ({"job": "judge_likert", "with": {"explanations": ["{ingest}"], "shots": "one"}},
     "shots 'one' needs examples"),
    ({"job": "judge_pairwise", "with": {"explanations": ["{ingest}"], "baseline": "b", "evaluators": ["disc"]}},
     "the disc evaluator needs a reward model"),
    ({"job": "judge_detect", "with": {"reviews": ["{ingest}"], "conditions": ["item_replace", "typo"]}},
     "unknown condition(s) ['typo']"),
    ({"job": "judge_detect", "with": {}}, "detect needs contexts (--contexts FILE) or reviews"),
    ({"job": "generate_llm", "with": {"input": "{ingest}", "methods": ["preference_logics"]}},
     "unknown method(s) ['preference_logics']"),
    ({"job": "generate_train", "with": {"data": "{split}", "target": "review", "model": "nrt",
                                        "settings": {"hiden": 64}}},
     "unknown nrt setting(s) hiden"),
    ({"job": "generate_train", "with": {"data": "{split}", "target": "review", "model": "peter",
                                        "grid": {"vocab_size": [100, 200]}}},
     "cannot search 'vocab_size'"),
    ({"job": "generate_train", "with": {"data": "{split}", "model": "gpt"}}, "gpt"),
    ({"job": "star_train", "with": {"data": "{split}", "grid": {"lr": [0.1]}, "sweep": "mu"}},
     "sweep mu: give its values with grid mu=v1,v2"),
    ({"job": "star_train", "with": {"data": "{split}", "grid": {"seed": [1, 2]}, "seeds": 3}},
     "give either seeds or a grid of seed"),
    # Ranges: found by the dry run, not by the job after it read every review.
    ({"job": "split", "with": {"input": "{ingest}", "train": 1.5}},
     "steps.x.with (dataset a).train: Input should be less than 1"),
    ({"job": "split", "with": {"input": "{ingest}", "train": 0.8, "valid": 0.2}},
     "steps.x.with (dataset a): train + valid must be below 1"),
    ({"job": "ingest", "with": {"inputs": "{dataset.inputs}", "min_rating": 5, "max_rating": 1}},
     "steps.x.with (dataset a): min_rating (5) is above max_rating (1)"),
    ({"job": "expscore_train", "with": {"inputs": "{dataset.inputs}", "rating_min": 5, "rating_max": 1}},
     "rating_max (1) must be above rating_min (5)"),
    ({"job": "star_baselines", "with": {"data": "{split}", "ks": [10, 0]}},
     "steps.x.with (dataset a).ks.1: Input should be greater than or equal to 1"),
    ({"job": "judge_detect", "with": {"reviews": ["{ingest}"], "evaluators": []}},
     "steps.x.with (dataset a).evaluators: List should have at least 1 item"),
])
def test_a_plan_refuses_every_setting_its_job_would_refuse(tmp_path, step, expected):
    """The plan builds each step's settings with the job's own config class, whose
    validators are the job's checks: a dry run that passes cannot fail later on a
    setting (the failure the issue saw: `metrics: [bleu]` passed the dry run, then the
    evaluate step failed hours into the study)."""
    msg = problems(tmp_path, study_dict(x={**step, "datasets": ["a"]}))
    assert expected in msg, msg


def test_every_problem_of_a_study_file_is_reported_in_one_run(tmp_path):
    """Six mistakes of six kinds (an unknown key, an unknown job, a setting out of its
    range, a missing input, a reference to no step, a cycle): one plan names them all,
    each with its step and setting, rather than one per run."""
    data = study_dict(x={"job": "stats", "with": {"input": "{y}"}, "datasets": ["a"]},
                      y={"job": "stats", "with": {"input": "{x}"}, "datasets": ["a"]})
    data["steps"]["split"]["wth"] = {"train": 0.7}
    data["steps"]["stats"]["job"] = "statz"
    data["steps"]["split"]["with"]["train"] = 1.5
    data["datasets"]["b"]["inputs"] = ["/nope/reviews.jsonl"]
    data["steps"]["clusters"]["with"]["input"] = "{ingets@a}"
    msg = problems(tmp_path, data)
    assert msg.count("\n  ") == 6 and "6 problems" in msg, msg
    for expected in ("steps.split.wth: unknown key",
                     "steps.stats.job: unknown job 'statz'",
                     "steps.split.with (dataset a).train: Input should be less than 1",
                     "datasets.b.inputs: /nope/reviews.jsonl does not exist",
                     "steps.clusters.with.input: {ingets@a} names no step",
                     "steps: a cycle: x@a -> y@a -> x@a"):
        assert expected in msg, msg


def test_a_step_the_file_cannot_describe_is_reported_once(tmp_path):
    """A step left out for a bad value of its own (here a `job` that is no name) is one
    problem; the steps that read it are not told again that it does not exist."""
    data = study_dict()
    data["steps"]["split"]["job"] = ["split"]
    data["steps"]["split"]["per_dataset"] = "sometimes"  # a bad optional key: its default applies
    data["steps"]["ingest"]["with"]["trian"] = 1
    msg = problems(tmp_path, data)
    assert "steps.split.job: Input should be a valid string" in msg
    assert "steps.split.per_dataset:" in msg and "trian: unknown key" in msg
    assert "names no step" not in msg and "{split}" not in msg, msg
    data = study_dict()
    data["steps"]["split"]["datasets"] = ["a", "c"]  # split@a still runs, and stats@a reads it
    assert problems(tmp_path, data).endswith("study.yaml: steps.split.datasets: no dataset 'c' (datasets: a, b)")


def test_a_step_folder_holding_what_it_reads_is_a_plan_problem(tmp_path):
    """A dataset file kept where the study puts a step's folder (OUT/a/ingest/...): the
    ingest job would write, and with a changed setting remove, around its own input, so
    the plan refuses it, naming the step, its folder and the file (issue 45)."""
    data_file = tmp_path / "out" / "a" / "ingest" / "r.jsonl"
    data_file.parent.mkdir(parents=True)
    data_file.write_text((SAMPLE / "reviews.jsonl").read_text())
    data = study_dict()
    data["datasets"]["a"]["inputs"] = [str(data_file)]
    text = problems(tmp_path, data)
    assert "steps.ingest (dataset a): --out" in text and f"holds an input of this job (inputs: {data_file})" in text


# ------------------------------------------------------------------ files written when a step was a "stage"

OLD_KEYS = {"steps": "stages", "steps_as": "stages_as"}  # today's key -> its name before issue 51


def in_old_keys(data: dict) -> dict:
    """`data` as a study file written when a step was called a "stage" (the keys in place)."""
    return {OLD_KEYS.get(k, k): v for k, v in data.items()}


def test_a_study_file_with_the_old_key_names_reads_as_todays(tmp_path):
    """A study file written before the rename (`stages:`, `stages_as:`) is the same study:
    the same steps and settings, and the same plan down to every fingerprint, so a study
    folder it already ran resumes instead of running everything again."""
    data = {**study_dict(), "steps_as": "job"}  # not the default, so a key left unread shows
    old = in_old_keys(data)
    assert "stages" in old and "stages_as" in old and "steps" not in old
    files = {}
    for name, content in (("new", data), ("old", old)):
        files[name] = tmp_path / name / "study.yaml"
        files[name].parent.mkdir()
        files[name].write_text(yaml.safe_dump(content, sort_keys=False))
    new_study, old_study = load_study(files["new"]), load_study(files["old"])
    assert old_study.steps_as == "job" and list(old_study.steps) == ["ingest", "split", "stats", "clusters"]
    assert old_study.model_dump() == new_study.model_dump()
    assert old_study.load_problems == new_study.load_problems == []
    plans = [build_plan(study, files[name], tmp_path / "out") for name, study in (("new", new_study),
                                                                                  ("old", old_study))]
    assert plans[0].order == plans[1].order
    assert {k: i.fingerprint for k, i in plans[0].instances.items()} == \
        {k: i.fingerprint for k, i in plans[1].instances.items()}


@pytest.mark.parametrize("old, new", [("stages", "steps"), ("stages_as", "steps_as")])
def test_a_study_file_with_both_names_of_a_key_is_refused(tmp_path, old, new):
    """Half a rename (some steps under `stages:`, the rest under `steps:`; `stages_as:`
    beside `steps_as:`) is refused naming both keys, rather than one of them silently
    winning and half the steps, or the chosen way to run them, left out."""
    data = study_dict()
    if old == "stages":
        data["stages"] = {"extra": data["steps"].pop("clusters")}
    else:
        data.update(stages_as="process", steps_as="job")
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(StudyError) as err:
        load_study(f)
    msg = str(err.value)
    assert f"{old}:" in msg and f"{new}:" in msg, msg


def test_a_study_json_with_the_old_names_resumes_and_reports(tmp_path):
    """study.json as an older rexeval wrote it ("stages", each record's "stage") is read
    in today's names: the plan finds its complete instances done (nothing re-runs), and
    the report finds every instance with its step."""
    from rexeval.pipelines.core.io import write_json_atomic
    from rexeval.pipelines.study.plan import read_state
    from rexeval.pipelines.study.report_model import read_study

    plan = plan_of(tmp_path, study_dict())
    out = tmp_path / "out"
    records = {k: {"stage": k.split("@")[0], "job": i.job.name, "dataset": k.partition("@")[2] or None,
                   "out": str(i.out), "status": "complete", "fingerprint": i.fingerprint, "settings": i.settings,
                   "seconds": 1.5, "finished": "2025-11-25T10:00:00+00:00", "summary": {"rows": 3}}
               for k, i in plan.instances.items()}
    for i in plan.instances.values():
        i.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "study.json", {"name": "t", "out": str(out), "stages": records})

    state = read_state(out)
    assert "stages" not in state and sorted(state["steps"]) == sorted(plan.order)
    assert state["steps"]["split@a"] == {**{k: v for k, v in records["split@a"].items() if k != "stage"},
                                         "step": "split"}
    assert {k: what for k, (what, _) in status_of(plan, state).items()} == dict.fromkeys(plan.order, "done")

    header, instances, notes = read_study(out)
    assert notes == [] and "stages" not in header
    assert sorted((i.name, i.step, i.status) for i in instances) == [
        ("clusters", "clusters", "complete"), ("ingest@a", "ingest", "complete"), ("ingest@b", "ingest", "complete"),
        ("split@a", "split", "complete"), ("stats@a", "stats", "complete")]
