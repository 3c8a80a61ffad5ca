"""wire.py: what a rank sends comes back as plain data or as Malformed, never as anything else and never at a cost
beyond its bytes; what a rank says reaches a file or a person as one escaped line (issue #49, "A rank's words are
data")."""
import contextlib
import dataclasses
import io
import math
import os
import pickle
import random
import struct
import threading
import time
import unicodedata
from types import SimpleNamespace
from typing import Any, NamedTuple, Optional

import pytest
import torch

import wire


@dataclasses.dataclass
class Failure:
    message: str
    follow_on: bool = False


class Result(NamedTuple):
    ok: bool
    value: Any
    import_s: Optional[float] = None


TYPES = {"Failure": Failure, "Result": Result}
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def round_trip(obj):
    return wire.decode(wire.encode(obj, TYPES), TYPES)


def refused(raw: bytes, types: dict = TYPES, **limits) -> str:
    """decode's reason for refusing `raw`, which must come quickly."""
    started = time.monotonic()
    with pytest.raises(wire.Malformed) as caught:
        wire.decode(raw, types, **limits)
    assert time.monotonic() - started < 2.0
    reason = str(caught.value)
    assert "\n" not in reason
    return reason


# --------------------------------------------------------------------------------------------------------------
# encode / decode
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    None, True, False, 0, -1, 2**63 - 1, -2**63, 2**64 - 1, 1.5, float("inf"), -0.0, "", "héllo ∑ 🙂", b"",
    b"\x00\xff", [], (), {}, [1, [2, [3, (4, 5)]]], {"a": 1, 2: "b", None: [], (1, "x"): {"nested": b"y"}, 1.5: True},
    Failure("boom", True), Result(False, Failure("x")), Result(True, {"apart": [1.0, 2.0]}, 0.25),
])
def test_plain_values_come_back_equal_and_of_the_same_type(value):
    back = round_trip(value)
    assert back == value and type(back) is type(value)


def test_nan_comes_back_nan():
    assert round_trip(float("nan")) != round_trip(float("nan"))


def test_numpy_scalars_go_as_int_and_float():
    np = pytest.importorskip("numpy")
    assert [type(v) for v in round_trip([np.int32(3), np.float16(0.5)])] == [int, float]


@pytest.mark.parametrize("dtype", sorted(name for name in wire.TENSOR_DTYPES if hasattr(torch, name)))
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0, 4), (4, 5)])
def test_tensors_come_back_with_their_dtype_shape_and_values(dtype, shape):
    made = (torch.arange(math.prod(shape)) % 7).reshape(shape).to(getattr(torch, dtype))
    back = round_trip({"output": made})["output"]
    assert back.dtype == made.dtype and back.shape == made.shape
    assert torch.equal(back.view(torch.uint8) if made.element_size() == 1 else back.float(),
                       made.view(torch.uint8) if made.element_size() == 1 else made.float())


def test_a_view_is_sent_as_its_own_values_and_comes_back_writable():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base.t()[1:3]
    back = round_trip(view)
    assert torch.equal(back, view)
    back += 1  # a copy of the message's bytes, not a view of them
    assert torch.equal(back, view + 1)


def test_a_bool_tensor_holds_only_true_and_false_whatever_its_bytes():
    raw = wire.encode(torch.tensor([True, False, True]))
    forged = raw[:-3] + b"\x02\x00\xff"
    back = wire.decode(forged)
    assert back.tolist() == [True, False, True] and back.view(torch.uint8).tolist() == [1, 0, 1]


@pytest.mark.parametrize("value", [object(), {1, 2}, 2**64, -2**63 - 1, torch.zeros(2, dtype=torch.complex64),
                                   bytearray(b"x"), {frozenset(): 1}, Failure, Failure("x").__dict__.items()])
def test_anything_else_is_unsendable(value):
    with pytest.raises(wire.Unsendable):
        wire.encode(value, TYPES)


def test_a_record_not_named_in_the_types_is_unsendable():
    with pytest.raises(wire.Unsendable):
        wire.encode(Failure("x"))


def test_a_cycle_is_unsendable():
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(wire.Unsendable, match="deeper"):
        wire.encode(cycle)


def test_a_lone_surrogate_comes_back_escaped_and_writable_as_utf8():
    back = round_trip(Result(False, Failure("bad \ud800 end \udcff")))
    assert back.value.message == "bad \\ud800 end \\udcff"
    back.value.message.encode("utf-8")


def test_a_pickle_is_refused():
    assert "magic" in refused(pickle.dumps({"a": 1}))


def _frame(*parts: bytes) -> bytes:
    return wire.MAGIC + b"".join(parts)


def test_a_declared_length_beyond_the_payload_is_refused_before_allocating():
    assert "remain" in refused(_frame(b"s", struct.pack("<I", 2**32 - 1), b"abc"))
    assert "remain" in refused(_frame(b"b", struct.pack("<I", 10**9)))


def test_a_huge_declared_count_is_refused_before_building_anything():
    assert "items" in refused(_frame(b"l", struct.pack("<I", 2**32 - 1)))
    assert "items" in refused(_frame(b"d", struct.pack("<I", 5), b"N"))


def test_deep_nesting_is_refused():
    depth = 100_000
    assert "deeper" in refused(_frame(b"l\x01\x00\x00\x00" * depth + b"N"))
    assert round_trip([[[[None]]]]) == [[[[None]]]]
    assert "deeper" in refused(wire.encode([[[[None]]]]), max_depth=3)


def test_the_item_limit_bounds_the_objects_built():
    raw = wire.encode([None] * 5000)
    assert "values" in refused(raw, max_items=1000)
    assert len(wire.decode(raw, max_items=5001)) == 5000


def test_a_message_over_the_size_limit_is_refused_without_being_read():
    limit = 1 << 20
    raw = wire.encode("x" * (limit + 20_000_000))
    assert f"at most {limit}" in refused(raw, max_bytes=limit)


def test_no_message_builds_more_values_than_its_bytes():
    """The nested-list pickle (152 bytes, 2**23 lists through shared references) has no counterpart: without
    back-references every value costs at least one byte of the message."""
    raw = wire.encode([[[[[]] * 2] * 2] * 2] * 2)
    counted = []

    def count(value):
        counted.append(1)
        for item in value:
            count(item)

    count(wire.decode(raw))
    assert len(counted) <= len(raw)


def test_trailing_bytes_and_unknown_tags_are_refused():
    assert "after" in refused(wire.encode(1) + b"N")
    assert "tag" in refused(_frame(b"?"))


def test_every_truncation_of_a_message_is_refused():
    raw = wire.encode(Result(True, {"x": torch.ones(3), "s": "text", "l": [1, 2.5, None]}, 1.0), TYPES)
    for end in range(len(raw)):
        refused(raw[:end])


def test_mangled_messages_decode_or_are_refused_and_nothing_else():
    raw = wire.encode(Result(True, {"x": torch.ones(2, 3), "s": "text", "l": [1, (2.5, b"b")]}, 1.0), TYPES)
    rng = random.Random(49)
    for _ in range(3000):
        mangled = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            mangled[rng.randrange(len(mangled))] = rng.randrange(256)
        try:
            wire.decode(bytes(mangled), TYPES)
        except wire.Malformed:
            pass


def test_records_are_built_only_from_the_named_types_and_their_fields():
    assert "unknown type" in refused(wire.encode(Failure("x"), TYPES), types={"Result": Result})
    forged = wire.encode(Failure("x"), TYPES).replace(b"follow_on", b"follow_no")
    assert "unknown field" in refused(forged)
    missing = _frame(b"r", b"\x07Failure", wire.encode({"follow_on": True})[len(wire.MAGIC):])
    assert "does not fit" in refused(missing)


@pytest.mark.parametrize("record", [Failure(12345), Failure("x", "yes"), Failure("x", 1), Result("yes", None),
                                    Result(False, Failure("x"), "fast"), Result(True, None, True)])
def test_a_record_whose_fields_are_not_of_their_types_is_refused(record):
    """Red team 13: a record's fields are used as their declared types by the owner (an int message sliced, a str
    time sorted with floats, a str ok): any other type refuses the message. An int fits a float field."""
    assert "does not fit" in refused(wire.encode(record, TYPES))


def test_a_record_whose_fields_fit_their_types_comes_back():
    assert round_trip(Result(True, {"any": ["value"]}, 3)) == Result(True, {"any": ["value"]}, 3)
    assert round_trip(Result(False, Failure("x", True), None)) == Result(False, Failure("x", True), None)


def test_a_forged_tensor_is_refused():
    good = wire.encode(torch.zeros(2, 2))
    wrong_size = good.replace(struct.pack("<Q", 16), struct.pack("<Q", 12))
    assert "bytes" in refused(wrong_size[:-4])
    assert "dtype" in refused(good.replace(b"\x07float32", b"\x07complex"))
    huge = _frame(b"x\x07float32\x02", struct.pack("<QQ", 2**62, 0), struct.pack("<Q", 0))
    assert "shape" in refused(huge)


# --------------------------------------------------------------------------------------------------------------
# as_text
# --------------------------------------------------------------------------------------------------------------

FORGED = "boom\ntest.0.status: pass\r\ntest.1.status: pass\u2028check: pass\x1b[2K\x85\u202e"


def is_one_safe_line(text: str) -> bool:
    return (len(text.splitlines()) <= 1 and not any(ch in text for ch in LINE_BREAKS)
            and all(unicodedata.category(ch) not in ("Cc", "Cs", "Zl", "Zp", "Cf") for ch in text)  # Cf: red team 36
            and text.encode("utf-8") is not None)


def test_forged_result_lines_stay_on_one_line_with_their_breaks_shown():
    text = wire.as_text(FORGED)
    assert is_one_safe_line(text)
    assert text == "boom\\ntest.0.status: pass\\r\\ntest.1.status: pass\\u2028check: pass\\x1b[2K\\x85\\u202e"


def test_every_code_point_comes_out_as_one_writable_line():
    every = "".join(chr(code) for code in range(0x3000)) + "".join(chr(code) for code in range(0xD800, 0xE000))
    assert is_one_safe_line(wire.as_text(every, limit=10**6))


def test_characters_drawn_blank_are_escaped():
    """Red team 53: Hangul fillers, the Braille blank, the combining grapheme joiner and a wide space passed, and hid
    `ok: all cases pass` among blanks."""
    assert wire.as_text("a\u3164\u115f\u2800\u034f\u3000\u00a0b c") == "a\\u3164\\u115f\\u2800\\u034f\\u3000\\xa0b c"


def test_lone_surrogates_and_undecodable_bytes_are_escaped():
    assert wire.as_text("a\ud800b") == "a\\ud800b"
    assert wire.as_text(b"ok \xff\xfe\n\xc3\xa9") == "ok \\xff\\xfe\\né"


def test_a_long_text_is_cut_with_a_count():
    assert wire.as_text("x" * 5000, limit=100) == "x" * 100 + "...[4900 more characters]"
    assert wire.as_text(b"y" * 30_000_000, limit=10) == "y" * 10 + "...[29999990 more bytes]"
    cut = wire.as_text("\n" * 50, limit=9)
    assert cut == "\\n" * 4 + "...[46 more characters]"


def test_anything_else_is_shown_by_its_str_and_a_raising_str_is_named():
    class Hostile:
        def __str__(self):
            raise RuntimeError("no")

    assert wire.as_text(ValueError("bad\nline")) == "bad\\nline"
    assert "Hostile" in wire.as_text(Hostile()) and is_one_safe_line(wire.as_text(Hostile()))


# --------------------------------------------------------------------------------------------------------------
# RankText
# --------------------------------------------------------------------------------------------------------------


def rank_output(*writes: bytes, pause_s: float = 0.0, **options) -> list:
    """What RankText writes for a rank that made these writes (with a pause between them) and ended."""
    read_fd, write_fd = os.pipe()
    stream = io.StringIO()
    reader = wire.RankText(read_fd, stream, "[rank1] ", **options)
    for data in writes:
        os.write(write_fd, data)  # a full pipe waits for the reader
        time.sleep(pause_s)
    os.close(write_fd)
    assert reader.close()
    return stream.getvalue().split("\n")[:-1]


def test_each_line_is_prefixed_and_escaped_so_none_is_forged():
    lines = rank_output(FORGED.encode("utf-8", "surrogatepass") + b"\n\x1b]0;title\x07done\n")
    assert lines == ["[rank1] boom", "[rank1] test.0.status: pass",
                     "[rank1] test.1.status: pass\\u2028check: pass\\x1b[2K\\x85\\u202e",
                     "[rank1] \\x1b]0;title\\x07done"]


def test_a_line_split_across_reads_is_one_line_and_an_unended_one_is_kept():
    assert rank_output(b"hel", b"lo\nwor", b"ld", pause_s=3 * wire.POLL_S) == ["[rank1] hello", "[rank1] world"]


def test_undecodable_bytes_are_escaped():
    assert rank_output(b"\xff\xfe\xc3\n\xe2\x82\xac\n") == ["[rank1] \\xff\\xfe\\xc3", "[rank1] €"]


def test_a_megabyte_without_a_newline_is_one_cut_line():
    lines = rank_output(b"z" * (1 << 20), line_chars=100, budget=4 << 20)
    assert lines == ["[rank1] " + "z" * 100 + f"...[{(1 << 20) - 100} more bytes]"]


def test_past_the_budget_the_output_is_counted_not_shown():
    lines = rank_output(b"line\n" * 1000, budget=50)
    assert lines == ["[rank1] line"] * 10 + ["[rank1] ... dropped 4950 more bytes of output (this rank may print 50 "
                                               "bytes)"]


def test_a_relabel_leaves_every_line_written_before_it_under_the_label_before(monkeypatch):
    """A worker changes rank from case to case; the owner relabels its text as each case starts (red team 64: a line
    the last case's rank 1 printed came out under the next case's `[rank0] `). Here the reader is slow (each read's
    lines take 0.2 s to write): lines written before the relabel, and a line begun, come out under the label
    before, those after under the new one."""
    take = wire.RankText._take

    def slow_take(self, chunk):
        time.sleep(0.2)
        take(self, chunk)

    monkeypatch.setattr(wire.RankText, "_take", slow_take)
    read_fd, write_fd = os.pipe()
    stream = io.StringIO()
    reader = wire.RankText(read_fd, stream, "[rank1] ")
    os.write(write_fd, b"first\n")
    time.sleep(0.05)  # the reader has it, and is slow with it
    os.write(write_fd, b"second\nbegun")
    reader.relabel("[rank0] ")
    os.write(write_fd, b"\nthird\n")
    os.close(write_fd)
    assert reader.close()
    assert stream.getvalue().split("\n")[:-1] == ["[rank1] first", "[rank1] second", "[rank1] begun", "[rank0] ",
                                                  "[rank0] third"]


def test_a_relabel_returns_while_a_rank_writes_without_end():
    read_fd, write_fd = os.pipe()
    reader = wire.RankText(read_fd, io.StringIO(), "[rank0] ")
    stop = threading.Event()

    def chatter():
        with contextlib.suppress(OSError):
            while not stop.is_set():
                os.write(write_fd, b"x" * 4096 + b"\n")

    writer = threading.Thread(target=chatter, daemon=True)
    writer.start()
    started = time.monotonic()
    reader.relabel("[rank1] ")
    took = time.monotonic() - started
    stop.set()
    assert reader.close(wait_s=0.5)
    os.close(write_fd)
    writer.join(5)
    assert took < 2, took


def test_close_returns_while_a_process_left_behind_keeps_the_pipe_open():
    read_fd, write_fd = os.pipe()
    stream = io.StringIO()
    reader = wire.RankText(read_fd, stream, "[rank0] ")
    stop, wrote = threading.Event(), threading.Event()

    def chatter():
        with contextlib.suppress(OSError):  # the reader's end closed
            while not stop.is_set():
                os.write(write_fd, b"still here\n")
                wrote.set()

    writer = threading.Thread(target=chatter, daemon=True)
    writer.start()
    assert wrote.wait(30)  # a loaded machine may not run the writer before the close (CI, 2026-11-27: nothing read)
    started = time.monotonic()
    assert reader.close(wait_s=0.5)
    assert time.monotonic() - started < 3
    stop.set()
    os.close(write_fd)  # the writer may block no more: the reader closed its end
    writer.join(5)
    assert stream.getvalue().startswith("[rank0] still here\n")


# --------------------------------------------------------------------------------------------------------------
# Where a rank's words reach a file or a person
# --------------------------------------------------------------------------------------------------------------


def test_a_value_stays_on_its_line_in_the_result_channel():
    from a2a import rows

    text = ("test.0.status: fail\ntest.0.error: boom\u2028test.0.status: pass\x85check: pass\rtest-count: 9\n"
            "stray words\n  \ntest-count: 1\n")
    assert rows.parse_popcorn(text) == {"test.0.status": "fail", "test-count": "1",
                                        "test.0.error": "boom\u2028test.0.status: pass\x85check: pass\rtest-count: 9"}
    assert rows.stray_lines(text) == 1 and rows.repeated_keys(text) == []


def test_a_timed_entry_s_failure_is_one_escaped_cell_in_every_file():
    import eval as core
    import run_leaderboard

    run = SimpleNamespace(entries=[SimpleNamespace(name="v1", kind="version")], case_intervals=lambda *_: {},
                          failed={"v1": FORGED}, stopped={}, sync_inside=set())
    plan = SimpleNamespace(case_args=[{key: 1 for key in core.SPEC_KEYS}])
    (row,) = run_leaderboard.rows_of(run, plan)
    assert row["status"] == "fail" and row["error"] == wire.as_text(FORGED) and is_one_safe_line(row["error"])


def test_a_diff_s_failure_is_one_escaped_line():
    from a2a import diffing

    run = SimpleNamespace(samples={}, failed={"B": FORGED + "x" * 500})
    case = {"num_experts": 8, "experts_per_token": 2, "hidden_dim": 16, "max_num_tokens": 4}
    verdicts = [row["verdict"] for row in diffing.compare(run, [case])]
    assert verdicts and all(is_one_safe_line(v) and "B fails: boom\\ntest.0.status" in v for v in verdicts)
