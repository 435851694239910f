"""benchmarks/gpu_check.py on the CPU with --tiny: the GPU run's script cannot rot between
the sessions that are lent a GPU (issue 34)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.gpu_check import load_int8, save_int8, tie_aware_recall

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--tiny",
                           "--out", str(out), "--work", str(out / "work")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    report = json.loads((out / "gpu_check.json").read_text())
    return proc, report, out


@pytest.mark.slow
def test_every_part_runs_on_the_cpu_without_ray(tiny_run):
    proc, report, out = tiny_run
    failed = {p: r.get("error") for p, r in report["parts"].items() if not r.get("ok")}
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:], proc.stderr[-3000:])
    assert set(report["parts"]) == {"nli", "embed", "hf", "train", "tests"}
    # The GPU machine has no Ray: the script must reach rexeval's modules without it.
    assert report["ray_imported"] is False
    assert report["device"]["requested"] == "cpu" and report["versions"]["torch"] == torch.__version__
    assert (out / "gpu_check.log").read_text().count("part ") >= 5


@pytest.mark.slow
def test_the_figures_that_say_whether_a_gpu_path_is_right(tiny_run):
    parts = tiny_run[1]["parts"]
    nli = parts["nli"]["models"]["minilm"]
    for dtype in ("float32", "bfloat16"):
        assert nli[dtype]["actual_dtype"] == f"torch.{dtype}"
        assert nli[dtype]["score_s"] > 0 and nli[dtype]["ours_over_bound"] > 0
        # The GPU's overlapped loop, run here on the CPU beside the plain one: same rows.
        assert nli[dtype]["loop"] == "plain" and nli[dtype]["other_loop"] == "overlapped"
        assert nli[dtype]["max_abs_diff_other_loop"] < 1e-4
    assert 0.0 <= nli["label_agreement_bf16_vs_fp32"] <= 1.0
    # The same vectors: our exact torch top-k and FAISS's exact index find the same neighbours.
    assert parts["embed"]["recall_at_k_torch_vs_faiss_ties_counted"] == 1.0
    assert parts["embed"]["torch_top_k_same_on_cpu"] is True
    hf = parts["hf"]["float32"]
    assert hf["batched"]["errors"] == hf["single"]["errors"] == 0
    assert hf["identical_outputs"] == parts["hf"]["prompts"]  # padding must not change a row
    for name in ("expgcn", "bper+", "peter", "pepler"):
        m = parts["train"][name]
        assert "error" not in m, m
        # Both arms ran on the CPU here, from the same weights: the same computation.
        assert m["max_relative_gap"] < 1e-5, (name, m)
        assert all(np.isfinite(m["device_losses"]))
    assert parts["train"]["peter"]["decode"]["tokens_per_s"] > 0
    tests = parts["tests"]
    assert tests["failed"] == 0 and tests["skipped"] >= 4  # no CUDA here: every gpu test skips
    assert any("test_expgcn" in f for f in tests["files"])


def test_a_cuda_run_without_cuda_says_what_to_do(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cuda", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--device cpu" in proc.stderr


def test_int8_weights_keep_each_row_within_half_a_step(tmp_path):
    from safetensors.torch import save_file

    w = torch.tensor([[1.0, -0.5, 0.25], [0.0, 0.0, 0.0], [3.0, 2.9, -1.0]])
    bias = torch.tensor([0.1, -0.2, 0.3])
    save_file({"w": w, "b": bias}, str(tmp_path / "model.safetensors"))
    save_int8(tmp_path, tmp_path / "q.pt")
    back = load_int8(tmp_path / "q.pt")
    step = w.abs().amax(1, keepdim=True) / 127  # row 0: 1/127, row 2: 3/127
    assert torch.all((back["w"] - w).abs() <= step / 2 + 1e-7)
    assert torch.equal(back["w"][1], torch.zeros(3))
    assert back["w"][0, 0] == 1.0 and back["w"][2, 0] == 3.0  # a row's largest value is exact
    torch.testing.assert_close(back["b"], bias, atol=1e-3, rtol=0)  # float16


def test_tie_aware_recall_counts_a_tied_neighbour_as_found():
    # Rows 1 and 2 are the same vector (as "The pedal" and "the pedal" under an uncased
    # tokenizer): for query 0 either one is a correct first neighbour.
    x = np.array([[1.0, 0.0], [0.8, 0.6], [0.8, 0.6], [0.0, 1.0]], dtype=np.float32)
    ours = np.array([[1], [2], [1], [1]])
    theirs = np.array([[2], [2], [1], [2]])
    assert tie_aware_recall(x, ours, theirs) == 1.0
    wrong = np.array([[3], [2], [1], [1]])  # query 0: row 3 (cos 0) instead of 0.8
    assert tie_aware_recall(x, wrong, theirs) == 0.75
