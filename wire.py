"""What a rank says, as data: the only way its words reach the owner, a file or a person.

Everything inside a rank process belongs to the submission, so the owner treats every byte a rank sends as hostile:

    encode(obj, types) -> bytes            a rank's message, in a small self-describing binary format (not pickle)
    decode(raw, types, max_bytes=..., max_depth=..., max_items=...)
                                           the owner's side: plain objects or Malformed, never anything else
    as_text(value, limit) -> str           anything a rank supplied, as one printable line
    RankText(fd, stream, prefix)           a rank's stdout or stderr, line by line through as_text, within a budget

The format: two magic bytes, then one value. A value is a one-byte tag and its payload; every length is a fixed-size
count in front of what it counts, checked against the bytes that remain before anything is allocated. There are no
back-references, so a message can never make the owner build more objects than it has bytes. Imports only the
standard library (torch only when a tensor is encoded or decoded): every staged bundle carries this file.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import math
import numbers
import os
import re
import select
import stat
import struct
import threading
import types as _types
import typing
import unicodedata

MAX_BYTES = 1 << 30  # a whole message (the owner's pipe limit before this module)
MAX_DEPTH = 32  # containers inside containers
MAX_ITEMS = 1_000_000  # values in one message: what bounds the owner's objects (a tensor is one)
MAX_DIMS = 16

MAGIC = b"w1"
_U8, _U32, _U64, _I64, _F64 = (struct.Struct(f) for f in ("<B", "<I", "<Q", "<q", "<d"))

# Tensor dtypes a rank may send, with their item sizes (bool: any nonzero byte decodes as True).
TENSOR_DTYPES = {"bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2,
                 "float32": 4, "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
                 "float8_e5m2fnuz": 1}
_KEY_TYPES = (type(None), bool, int, float, str, bytes, tuple)


class Malformed(ValueError):
    """A message that is not this format, or breaks one of decode's limits; the message is one line."""


class Unsendable(TypeError):
    """encode was given something that is not plain data (or nested deeper than MAX_DEPTH)."""


# --------------------------------------------------------------------------------------------------------------
# encode
# --------------------------------------------------------------------------------------------------------------


def encode(obj, types: dict | None = None) -> bytes:
    """`obj` in the wire format. Plain data: None, bool, int (64-bit signed or unsigned), float, str, bytes, list,
    tuple, dict (keys: None, bool, int, float, str, bytes or tuples of those), CPU-copyable strided torch tensors of
    a TENSOR_DTYPES dtype, and instances of the dataclasses and NamedTuples in `types` ({name: class}; matched by
    class name, sent as their fields). numbers.Integral and numbers.Real (numpy scalars) go as int and float.
    Raises Unsendable for anything else."""
    parts: list = [MAGIC]
    _encode(obj, types or {}, parts, 0)
    return b"".join(parts)


def _encode(obj, types: dict, parts: list, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise Unsendable(f"nested deeper than {MAX_DEPTH} (a cycle?)")
    kind = type(obj)
    if obj is None:
        parts.append(b"N")
    elif kind is bool:
        parts.append(b"T" if obj else b"F")
    elif isinstance(obj, str):
        data = str.encode(obj, "utf-8", "surrogatepass")
        parts += [b"s", _U32.pack(_length(data)), data]
    elif isinstance(obj, bytes):
        parts += [b"b", _U32.pack(_length(obj)), bytes(obj)]
    elif kind.__name__ in types and _is_record(obj):
        name = kind.__name__.encode("utf-8")
        fields = obj._asdict() if isinstance(obj, tuple) else {f.name: getattr(obj, f.name)
                                                               for f in dataclasses.fields(obj)}
        parts += [b"r", _U8.pack(len(name)), name]
        _encode(fields, types, parts, depth + 1)
    elif isinstance(obj, (list, tuple)):
        parts += [b"t" if isinstance(obj, tuple) else b"l", _U32.pack(_length(obj))]
        for item in obj:
            _encode(item, types, parts, depth + 1)
    elif isinstance(obj, dict):
        parts += [b"d", _U32.pack(_length(obj))]
        for key, value in obj.items():
            if not isinstance(key, _KEY_TYPES):
                raise Unsendable(f"a dict key of type {type(key).__name__}")
            _encode(key, types, parts, depth + 1)
            _encode(value, types, parts, depth + 1)
    elif kind.__name__ == "Tensor" and kind.__module__ == "torch":
        _encode_tensor(obj, parts)
    elif isinstance(obj, numbers.Integral):
        value = int(obj)
        if -(1 << 63) <= value < (1 << 63):
            parts += [b"i", _I64.pack(value)]
        elif 0 <= value < (1 << 64):
            parts += [b"u", _U64.pack(value)]
        else:
            raise Unsendable(f"an int of {value.bit_length()} bits (at most 64)")
    elif isinstance(obj, numbers.Real):
        parts += [b"f", _F64.pack(float(obj))]
    else:
        raise Unsendable(f"a {kind.__module__}.{kind.__name__} cannot be sent to the evaluator")


def _is_record(obj) -> bool:
    return (dataclasses.is_dataclass(obj) and not isinstance(obj, type)) or \
        (isinstance(obj, tuple) and hasattr(type(obj), "_fields"))


def _length(sized) -> int:
    if len(sized) >= 1 << 32:
        raise Unsendable(f"{len(sized)} bytes or items in one value (at most {(1 << 32) - 1})")
    return len(sized)


def _encode_tensor(tensor, parts: list) -> None:
    import torch

    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in TENSOR_DTYPES or tensor.layout != torch.strided or tensor.dim() > MAX_DIMS:
        raise Unsendable(f"a tensor of {tensor.dtype}, {tensor.layout}, {tensor.dim()} dims")
    flat = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
    data = ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size()) if flat.numel() else b""
    name = dtype.encode()
    parts += [b"x", _U8.pack(len(name)), name, _U8.pack(tensor.dim()),
              *(_U64.pack(size) for size in tensor.shape), _U64.pack(len(data)), data]


# --------------------------------------------------------------------------------------------------------------
# decode
# --------------------------------------------------------------------------------------------------------------


def decode(raw: bytes, types: dict | None = None, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
           max_items: int = MAX_ITEMS):
    """encode's inverse, built with this process's own classes (`types`, as for encode), every record's fields of
    their annotated types (wire._fits). A str comes back as sent,
    except that lone surrogates come back escaped (`\\udc80`), so every decoded str can be written as UTF-8. Raises
    Malformed, and nothing else, for any message that is not exactly one well-formed value within the limits."""
    if len(raw) > max_bytes:
        raise Malformed(f"a message of {len(raw)} bytes (at most {max_bytes})")
    reader = _Reader(memoryview(raw), types or {}, max_depth, max_items)
    if reader.take(len(MAGIC)) != MAGIC:
        raise Malformed("not a wire message (no magic bytes)")
    try:
        value = reader.value(0)
    except RecursionError:  # max_depth above what this interpreter's stack allows
        raise Malformed("nested too deeply for this interpreter") from None
    if reader.pos != len(raw):
        raise Malformed(f"{len(raw) - reader.pos} bytes after the message's value")
    return value


class _Reader:
    def __init__(self, raw: memoryview, types: dict, max_depth: int, max_items: int):
        self.raw, self.types, self.max_depth, self.max_items = raw, types, max_depth, max_items
        self.pos = 0
        self.items = 0

    def take(self, n: int) -> memoryview:
        if n > len(self.raw) - self.pos:
            raise Malformed(f"a length of {n} bytes at offset {self.pos}, where {len(self.raw) - self.pos} remain")
        self.pos += n
        return self.raw[self.pos - n:self.pos]

    def number(self, form: struct.Struct):
        return form.unpack(self.take(form.size))[0]

    def count(self) -> int:
        """A container's item count, each item at least one byte: never more than the bytes that remain."""
        n = self.number(_U32)
        if n > len(self.raw) - self.pos or self.items + n > self.max_items:
            raise Malformed(f"a container of {n} items at offset {self.pos} ({len(self.raw) - self.pos} bytes "
                            f"remain; at most {self.max_items} values in all)")
        return n

    def value(self, depth: int):
        self.items += 1
        if self.items > self.max_items:
            raise Malformed(f"more than {self.max_items} values")
        if depth > self.max_depth:
            raise Malformed(f"nested deeper than {self.max_depth}")
        tag = bytes(self.take(1))
        if tag == b"N":
            return None
        if tag in (b"T", b"F"):
            return tag == b"T"
        if tag == b"i":
            return self.number(_I64)
        if tag == b"u":
            return self.number(_U64)
        if tag == b"f":
            return self.number(_F64)
        if tag == b"s":
            return self.text(self.take(self.number(_U32)))
        if tag == b"b":
            return bytes(self.take(self.number(_U32)))
        if tag in (b"l", b"t"):
            items = [self.value(depth + 1) for _ in range(self.count())]
            return items if tag == b"l" else tuple(items)
        if tag == b"d":
            return self.mapping(depth)
        if tag == b"r":
            return self.record(depth)
        if tag == b"x":
            return self.tensor()
        raise Malformed(f"unknown tag {tag!r} at offset {self.pos - 1}")

    def text(self, data: memoryview) -> str:
        try:
            text = str(data, "utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise Malformed(f"a str that is not UTF-8 ({exc.reason} at byte {exc.start})") from None
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: escaped, so nothing downstream fails to write this str
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        return text

    def mapping(self, depth: int) -> dict:
        out = {}
        for _ in range(self.count()):
            key = self.value(depth + 1)
            if not isinstance(key, _KEY_TYPES):
                raise Malformed(f"a dict key of type {type(key).__name__}")
            try:
                out[key] = self.value(depth + 1)
            except TypeError:  # a tuple key holding a list
                raise Malformed("an unhashable dict key") from None
        return out

    def record(self, depth: int):
        name = self.text(self.take(self.number(_U8)))
        cls = self.types.get(name)
        if cls is None:
            raise Malformed(f"a record of unknown type {as_text(name, 60)}")
        if bytes(self.raw[self.pos:self.pos + 1]) != b"d":
            raise Malformed(f"a {name} record without its fields")
        fields = self.value(depth + 1)
        allowed = cls._fields if hasattr(cls, "_fields") else [f.name for f in dataclasses.fields(cls) if f.init]
        unknown = [key for key in fields if key not in allowed]
        if unknown:
            raise Malformed(f"a {name} record with unknown field {as_text(unknown[0], 60)}")
        # NOTES: the owner uses a record's fields as their declared types (red team 13: a str where a failure was
        # due crashed it with 114), so a field of another type refuses the message.
        hints = _hints(cls)
        wrong = next((key for key, value in fields.items() if key in hints and not _fits(value, hints[key])), None)
        if wrong is not None:
            raise Malformed(f"a {name} record that does not fit: its {as_text(wrong, 60)} is a "
                            f"{type(fields[wrong]).__name__}")
        try:
            return cls(**fields)
        except TypeError as exc:  # a required field missing
            raise Malformed(f"a {name} record that does not fit: {as_text(exc, 200)}") from None

    def tensor(self):
        import torch

        dtype = self.text(self.take(self.number(_U8)))
        if dtype not in TENSOR_DTYPES or not hasattr(torch, dtype):
            raise Malformed(f"a tensor of dtype {as_text(dtype, 60)}")
        dims = self.number(_U8)
        if dims > MAX_DIMS:
            raise Malformed(f"a tensor of {dims} dims (at most {MAX_DIMS})")
        shape = [self.number(_U64) for _ in range(dims)]
        nbytes = self.number(_U64)
        if nbytes != math.prod(shape) * TENSOR_DTYPES[dtype] or any(size >= 1 << 48 for size in shape):
            raise Malformed(f"a {dtype} tensor of shape {shape} with {nbytes} bytes")
        data = self.take(nbytes)
        try:
            if not nbytes:
                return torch.empty(shape, dtype=getattr(torch, dtype))
            flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if dtype == "bool":
                return flat.ne(0).reshape(shape)
            return flat.view(getattr(torch, dtype)).reshape(shape)
        except (RuntimeError, ValueError) as exc:
            raise Malformed(f"a {dtype} tensor of shape {shape} torch would not build: {as_text(exc, 200)}") from None


_HINTS: dict = {}


def _hints(cls) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _fits(value, hint) -> bool:
    """Whether a decoded field is of its annotated type: a class, Any, a union (Optional) of those, or a generic
    alias (list[int]: the container's type only). An int fits float (PEP 484); a bool fits bool alone."""
    if hint is typing.Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, _types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if origin is not None:
        return isinstance(value, origin)
    if hint is float:
        return type(value) in (int, float)
    if hint is int:
        return type(value) is int
    return isinstance(value, hint)


# --------------------------------------------------------------------------------------------------------------
# as_text
# --------------------------------------------------------------------------------------------------------------

TEXT_CHARS = 2000
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Besides the control characters (C0, DEL, C1), line and paragraph separators and lone surrogates: the bidirectional
# controls, which reorder what a terminal shows ("Trojan Source").
# Controls, lone surrogates, line and paragraph separators, and format characters: bidi marks and isolates, and the
# invisible ones (U+200B-U+200D, U+2060-U+2064, U+FEFF; red team 36: a zero-width space passed as_text unescaped)
_ESCAPED_CATEGORIES = ("Cc", "Cs", "Zl", "Zp", "Cf")
# Characters drawn as nothing or as blank space that are none of those (red team 53: Hangul fillers, the Braille
# blank, the combining grapheme joiner and wide spaces hid a rank's `ok: all cases pass` among blanks and bent the
# table's columns); a space other than U+0020 too.
_BLANK_GLYPHS = frozenset("\u034f\u115f\u1160\u2800\u3164\uffa0")


def as_text(value, limit: int = TEXT_CHARS) -> str:
    """Anything a rank supplied (str, bytes, or any other object, by str()) as one safe line: undecodable bytes
    (`\\xff`) and lone surrogates (`\\udc80`) escaped, every control, line-breaking and bidirectional character shown
    as an escape (`\\n`, `\\x1b`, `\\u2028`), at most `limit` characters, then a marker saying how many more
    characters (bytes, for bytes) were cut. Never raises."""
    try:
        text, cut, unit = _escaped_head(value, limit)
        return text + (f"...[{cut} more {unit}]" if cut else "")
    except Exception:  # _str_of has caught a raising str(); this keeps the promise whatever else goes wrong
        return f"<text that could not be shown: {type(value).__name__}>"


def _escaped_head(value, limit: int) -> tuple[str, int, str]:
    """as_text's line without its marker, with how many characters (or bytes) it left out and which."""
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, (bytes, bytearray)):
        # surrogateescape maps each undecodable byte to one character (U+DC80..U+DCFF), so the bytes shown are counted
        text, total, unit = bytes(value[:4 * limit + 4]).decode("utf-8", "surrogateescape"), len(value), "bytes"
    else:
        text = value if isinstance(value, str) else _str_of(value)
        total, unit = len(text), "characters"
    out, width, used = [], 0, 0
    for char in text[:limit]:  # every character takes at least one of the `limit`
        piece = _escaped(char, unit == "bytes")
        if width + len(piece) > limit:
            break
        out.append(piece)
        width += len(piece)
        used += 1
    shown = len(text[:used].encode("utf-8", "surrogateescape")) if unit == "bytes" else used
    return "".join(out), total - shown, unit


def _str_of(value) -> str:
    try:
        return str(value)
    except Exception as exc:
        return f"<{type(value).__name__} whose str() raised {type(exc).__name__}>"


def _escaped(char: str, from_bytes: bool) -> str:
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    category = unicodedata.category(char)
    if category in _ESCAPED_CATEGORIES or char in _BLANK_GLYPHS or category == "Zs" and char != " ":
        code = ord(char)
        if from_bytes and 0xDC80 <= code <= 0xDCFF:  # an undecodable byte
            return f"\\x{code - 0xDC00:02x}"
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return char


# What a terminal would act on in text of many lines (control characters but newline and tab; line and paragraph
# separators, bidi and other invisible format characters): written escaped (red team 30: an erase-line sequence in a
# comment hid its line from `cat code.diff`; red team 31: a rank's build log cleared the screen that showed it).
_UNSHOWN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def lines_shown(text: str) -> str:
    """`text` with its lines kept and everything else a terminal would act on escaped (`\x1b`, `\u202e`)."""
    return _UNSHOWN.sub(lambda found: ascii(found.group())[1:-1], text)


class NotRegular(ValueError):
    """A path that is not a regular file, or one larger than its reader's limit."""


def read_regular_file(path, limit: int) -> bytes:
    """A regular file's bytes, opened without blocking and read to at most `limit` (a FIFO would wait for a writer
    forever, a link to /dev/zero be read until memory ran out). OSError as the system gives it (a directory:
    IsADirectoryError), NotRegular for anything else that is not a file of at most `limit` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as source:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        if not stat.S_ISREG(mode):
            raise NotRegular("not a regular file (a FIFO, a device or a socket)")
        raw = source.read(limit + 1)
    if len(raw) > limit:
        raise NotRegular(f"larger than {limit} bytes")
    return raw


# --------------------------------------------------------------------------------------------------------------
# RankText
# --------------------------------------------------------------------------------------------------------------

RANK_TEXT_BUDGET = 1 << 20  # bytes a rank may print over its life; the rest is counted, not shown
# A line a result parser could read as a key (the runner's splits at the first colon and strips): a rank's such line
# is shown behind UNPREFIXED_KEY even where its lines are otherwise bare (red team 51: a log that the result file and
# stdout both reach, by other files, held a rank's `test.0.status: pass` as a bare line).
KEY_LIKE = re.compile(r"\s*[\w.-]+\s*:")
UNPREFIXED_KEY = "[rank] "
POLL_S = 0.1


def shares_a_file(fd: int, others) -> bool:
    """Whether `fd` is open on the same file as any of `others` (device and inode: a copy of a descriptor, 3>&1, or
    the file opened again counts; a closed one is no one's)."""
    found = os.fstat(fd)
    for other in others:
        try:
            if os.path.samestat(found, os.fstat(other)):
                return True
        except OSError:
            pass
    return False


class RankText:
    """Reads a rank's stdout or stderr (`fd`, the read end of its pipe; this object closes it) in a thread and
    writes each line to `stream` as `prefix` + as_text(line, line_chars): a line too long keeps its first
    `line_chars` bytes and says how many more it had. Past `budget` bytes nothing more is shown, and the last line
    says how many bytes were dropped. The pipe is read to its end either way, so a rank never blocks on it."""

    _write_lock = threading.Lock()  # one write at a time on a stream the ranks share

    def __init__(self, fd: int, stream, prefix: str, budget: int = RANK_TEXT_BUDGET, line_chars: int = TEXT_CHARS):
        self.fd, self.stream, self.prefix, self.budget, self.line_chars = fd, stream, prefix, budget, line_chars
        self.taken = 0  # bytes within the budget
        self.dropped = 0  # bytes beyond it
        self.line = bytearray()  # the current line's first line_chars bytes
        self.line_cut = 0  # and how many bytes of it did not fit
        self._closing = threading.Event()
        self._stop = threading.Event()
        self._wake_read, self._wake_write = os.pipe()  # ends the thread's wait on the pipe when closed
        os.set_blocking(self._wake_write, False)
        os.set_blocking(self.fd, False)  # a relabel may have read what the thread saw ready
        self._reading = threading.Lock()  # a read and its lines, whole, against a relabel
        self._thread = threading.Thread(target=self._pump, name=f"rank text {prefix.strip()}", daemon=True)
        self._thread.start()

    def close(self, wait_s: float = 5.0) -> bool:
        """Reads what the pipe still holds (at most `wait_s`), writes the last lines and closes the pipe; False when
        the thread did not end (its stream blocks)."""
        self._closing.set()
        self._wake()
        self._thread.join(wait_s)
        self._stop.set()  # a writer that never stops (a process the rank left behind) is cut off here
        self._thread.join(1.0)
        ended = not self._thread.is_alive()
        if ended:  # else the thread may still wait on them
            os.close(self._wake_read)
            os.close(self._wake_write)
        return ended

    def relabel(self, prefix: str, most_reads: int = 32) -> None:
        """Lines start with `prefix` from now on; what the pipe holds now, and a line begun, are written first under
        the one before (a worker changes rank from case to case: red team 64 saw a line of the last case's rank 1
        under the next case's `[rank0] `). At most `most_reads` reads of it: a rank writing without end holds no
        relabel."""
        with self._reading:
            with contextlib.suppress(OSError, ValueError):
                for _ in range(most_reads if self.fd >= 0 else 0):
                    if not (chunk := os.read(self.fd, 65536)):
                        break
                    self._take(chunk)
            if self.line or self.line_cut:
                self._write(self._line())
            self.prefix = prefix

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: a wake is pending already
            os.write(self._wake_write, b"w")

    def _pump(self) -> None:
        try:
            while not self._stop.is_set():
                closing = self._closing.is_set()
                ready, _, _ = select.select([self.fd, self._wake_read], [], [], 0 if closing else POLL_S)
                if self._wake_read in ready:
                    os.read(self._wake_read, 4096)
                    continue  # closing: seen at the top
                if not ready:
                    if closing:
                        break
                    continue
                with self._reading:
                    try:
                        chunk = os.read(self.fd, 65536)
                    except BlockingIOError:  # a relabel read it first
                        continue
                    if not chunk:
                        break
                    self._take(chunk)
        except (OSError, ValueError):  # the descriptor went away: what was read is still written below
            pass
        finally:
            with self._reading:
                if self.line or self.line_cut:
                    self._write(self._line())
                if self.dropped:
                    self._write(f"{self.prefix}... dropped {self.dropped} more bytes of output (this rank may "
                                f"print {self.budget} bytes)")
                with contextlib.suppress(OSError):
                    os.close(self.fd)
                self.fd = -1

    def _take(self, chunk: bytes) -> None:
        room = max(0, self.budget - self.taken)
        self.dropped += max(0, len(chunk) - room)
        chunk = chunk[:room]
        self.taken += len(chunk)
        *ended, rest = chunk.split(b"\n")
        lines = []
        for part in ended:
            self._append(part)
            lines.append(self._line())
        self._append(rest)
        if lines:  # one write for the chunk's lines: a flood of empty lines costs no write each
            self._write("\n".join(lines))

    def _append(self, part: bytes) -> None:
        room = max(0, self.line_chars - len(self.line))
        self.line += part[:room]
        self.line_cut += max(0, len(part) - room)

    def _line(self) -> str:
        """The current line, shown, and a fresh one started."""
        text, cut, _ = _escaped_head(bytes(self.line).removesuffix(b"\r"), self.line_chars)
        cut += self.line_cut
        self.line, self.line_cut = bytearray(), 0
        prefix = self.prefix or (UNPREFIXED_KEY if KEY_LIKE.match(text) else "")
        return prefix + text + (f"...[{cut} more bytes]" if cut else "")

    def _write(self, text: str) -> None:
        try:
            with self._write_lock:
                self.stream.write(text + "\n")
                self.stream.flush()
        except (OSError, ValueError):  # a closed stream: the pipe is still drained
            pass


# A compiler's, nvcc's or the linker's own error line (gcc/clang `file:line:col: error: ...`, `fatal error:`,
# nvcc `error : ...`, ld's `undefined reference`); ninja's `FAILED:` line and the command lines it echoes are not.
_COMPILER_ERROR = re.compile(r"(\berror\b\s*:|undefined reference|cannot find -l)", re.IGNORECASE)
_SOURCE_FOLDER = re.compile(r"^/\S*/(?=[^/\s]+:\d+)")  # a build folder before `main.cpp:1:23: error: ...`


def build_failure(text: str) -> str:
    """A failed extension build in one line: torch's first line (which extension) and the compiler's first error
    lines, without the command lines that ninja prints before them (they filled the cell, cut off, on a GPU image
    whose compiler failed; issue #50)."""
    head = text.split(":", 1)[0]
    lines = [line.strip() for line in text.splitlines()[1:]]
    errors = [_SOURCE_FOLDER.sub("", line)[:300] for line in lines
              if _COMPILER_ERROR.search(line) and not line.startswith(("[", "FAILED:"))]
    return f"{head}: {' | '.join(errors[:2]) or (lines[-1][:300] if lines else text[:200])}"


# The totals a profile reports per operator, each from whichever attribute the installed torch names it by.
PROFILE_TOTALS = {"self_cpu_us": ("self_cpu_time_total",), "cpu_us": ("cpu_time_total",),
                  "self_device_us": ("self_device_time_total", "self_cuda_time_total"),
                  "device_us": ("device_time_total", "cuda_time_total")}
PROFILE_ROWS = 20
PROFILE_VALUE_LIMIT = 1e18  # a row's count or µs: a sum over a million rows stays finite (int() of inf raises)


def profile_rows_fit(rows) -> bool:
    """Whether a rank's profile (its word) is rows profile_table can sum: each a dict with a str key and a finite
    number from 0 to PROFILE_VALUE_LIMIT for the count and every total."""
    return isinstance(rows, list) and all(
        isinstance(row, dict) and isinstance(row.get("key"), str)
        and all(type(row.get(name)) in (int, float) and 0 <= row[name] <= PROFILE_VALUE_LIMIT
                for name in ("count", *PROFILE_TOTALS)) for row in rows)


def profile_table(per_rank: list, on_gpu: bool, line_chars: int) -> str:
    """The operators of every rank's profile (rows that fit: profile_rows_fit) summed per key, the PROFILE_ROWS
    largest by self device time (CPU time on a CPU run), as a fixed-width table (the bundle has no tabulate), each
    line as_text within `line_chars`."""
    totals: dict = {}
    for rows in per_rank:
        for row in rows:
            into = totals.setdefault(row["key"], dict.fromkeys(("count", *PROFILE_TOTALS), 0.0))
            for name in into:
                into[name] += row[name]
    order = "self_device_us" if on_gpu else "self_cpu_us"
    ranked = sorted(totals.items(), key=lambda item: -item[1][order])[:PROFILE_ROWS]
    width = max([len("operator")] + [len(key[:60]) for key, _ in ranked])
    header = f"{'operator':<{width}}  {'calls':>7}" + "".join(f"  {name:>15}" for name in PROFILE_TOTALS)
    lines = [header, "-" * len(header)]
    for key, row in ranked:
        lines.append(f"{key[:60]:<{width}}  {int(row['count']):>7}" + "".join(f"  {row[n]:>15.1f}"
                                                                             for n in PROFILE_TOTALS))
    return " | ".join(as_text(line, line_chars) for line in lines) + f"\n(summed over {len(per_rank)} ranks; µs)"


class TooLarge(Exception):
    """A message whose length says more than its reader takes."""


class Frames:
    """The messages on a worker's connection (multiprocessing's frames: a 4-byte big-endian length, or -1 and 8
    bytes of length, then the bytes), read only as far as the connection says is there. NOTES: a blocking
    recv_bytes waited for every byte a length promised, in the thread whose deadline was to end it: a rank that
    sent a length and part of its bytes held the owner past every watchdog (red team 27)."""

    def __init__(self, max_bytes: int):
        self.buffer = bytearray()
        self.max_bytes = max_bytes

    def read(self, conn) -> list:
        """The whole messages that came with one read of what is there (call it once the connection is readable);
        EOFError at the connection's end, TooLarge for a length past the limit."""
        try:
            chunk = os.read(conn.fileno(), 1 << 20)
        except OSError:  # a reset connection: the worker died
            raise EOFError from None
        if not chunk:
            raise EOFError
        self.buffer += chunk
        messages = []
        while len(self.buffer) >= 4:
            (length,), head = struct.unpack_from("!i", self.buffer), 4
            if length == -1:
                if len(self.buffer) < 12:
                    break
                (length,), head = struct.unpack_from("!Q", self.buffer, 4), 12
            if not 0 <= length <= self.max_bytes:
                raise TooLarge
            if len(self.buffer) < head + length:
                break
            messages.append(bytes(self.buffer[head:head + length]))
            del self.buffer[:head + length]
        return messages
