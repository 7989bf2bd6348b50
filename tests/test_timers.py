"""ooc.core.timers.Timers: the one per-stage timer of the trainer and the loader's pipelines."""
import threading

from ooc.core.timers import Timers


def test_named_stages_start_at_zero_and_others_on_their_first_add():
    t = Timers(("sample", "gather"))
    assert t.snapshot() == {"sample": 0.0, "gather": 0.0}
    t.add("compute", 0.25)
    t.add("compute", 0.5)
    assert t.snapshot() == {"sample": 0.0, "gather": 0.0, "compute": 0.75}
    assert Timers().snapshot() == {}


def test_adds_from_several_threads_all_count():
    t = Timers()

    def add():
        for _ in range(2000):
            t.add("gather", 1.0)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.snapshot() == {"gather": 8000.0}


def test_a_timed_block_adds_to_its_stage_even_when_it_raises():
    t = Timers(("compute",))
    with t("compute"):
        pass
    try:
        with t("load"):
            raise RuntimeError("stop")
    except RuntimeError:
        pass
    s = t.snapshot()
    assert set(s) == {"compute", "load"} and s["compute"] >= 0.0 and s["load"] >= 0.0


def test_as_dict_rounds_to_microseconds_and_snapshot_is_a_copy():
    t = Timers()
    t.add("step", 1.23456789)
    assert t.as_dict() == {"step": 1.234568}
    snap = t.snapshot()
    snap["step"] = 0.0
    assert t.snapshot()["step"] == 1.23456789
