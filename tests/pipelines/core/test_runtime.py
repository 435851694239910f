"""A stage runs the same on a plain table and inside a Ray Data actor pool."""
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.runtime import map_stage, run_tasks
from rexeval.pipelines.core.stage import Resources, Stage


class Upper(Stage):
    name = "upper"
    resources = Resources(cpus=0.5)
    batch_size = 4

    def setup(self):
        self.loaded = getattr(self, "loaded", 0) + 1  # once per actor

    def process(self, batch):
        return batch.append_column("upper", pc.utf8_upper(batch.column("text"))) \
                    .append_column("setups", pa.array([self.loaded] * batch.num_rows))


def test_stage_runs_on_a_plain_table():
    s = Upper()
    s.setup()
    out = s(pa.table({"text": ["ab", "c"]}))
    assert out.column("upper").to_pylist() == ["AB", "C"]


def test_stage_runs_in_an_actor_pool(ray_session):
    import ray

    ds = ray.data.from_items([{"text": f"w{i}"} for i in range(20)], override_num_blocks=4)
    rows = map_stage(ds, Upper(), concurrency=2).take_all()
    assert sorted(r["upper"] for r in rows) == sorted(f"W{i}" for i in range(20))
    assert {r["setups"] for r in rows} == {1}  # setup ran once per actor, not per batch


def test_run_tasks_yields_one_row_per_task(ray_session):
    class Count(Stage):
        batch_size = 1

        def process(self, batch):
            return pa.table({"shard": batch.column("shard"), "double": pc.multiply(batch.column("shard"), 2)})

    rows = list(run_tasks([{"shard": i} for i in range(5)], Count(), concurrency=2))
    assert sorted((r["shard"], r["double"]) for r in rows) == [(i, 2 * i) for i in range(5)]
    assert list(run_tasks([], Count())) == []
