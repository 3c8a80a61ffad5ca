"""tools/step_anatomy.py's summary on hand-made stamps: the step decomposes into the named waits."""
from tools.step_anatomy import summarise


def step(start, cloned, returned, synced, passed, device_ns=0.0, call=True):
    return {"call": call, "stamps": [start, cloned, returned, synced, passed], "device_ns": device_ns}


def test_summary_names_lag_waits_and_the_remainder():
    # rank 1 leaves the first barrier 20 µs after rank 0; its call's device time is 50 µs, rank 0's 60 µs
    rank0 = [step(0, 5_000, 15_000, 70_000, 100_000, 60_000), step(0, 5_000, 5_000, 6_000, 30_000, call=False)]
    rank1 = [step(20_000, 25_000, 30_000, 80_000, 100_000, 50_000), step(10_000, 15_000, 15_000, 16_000, 30_000,
                                                                         call=False)]
    summary = summarise([rank0, rank1])
    assert summary["step"] == 100.0 and summary["floor"] == 30.0 and summary["device"] == 60.0
    assert summary["start_lag"] == 20.0 and summary["call_host"] == 10.0 and summary["sync_wait"] == 55.0
    assert summary["barrier_wait"] == 30.0 and summary["step - floor - device"] == 10.0
