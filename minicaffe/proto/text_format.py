"""The protobuf text format (a ``.prototxt``), read and written from scratch.

A prototxt is the body of one message: a list of fields, each ``name: value`` for a scalar or
``name { ... }`` for a sub-message::

    name: "LeNet"                       # a string
    layer {                             # a sub-message (repeated field: one per occurrence)
      name: "pool1"
      type: "Pooling"
      pooling_param { pool: MAX kernel_size: 2 stride: 2 }   # MAX is an enum value name
    }

Reading happens in two stages, as in any compiler front end:

1. The **tokenizer** (``Tokenizer``) cuts the text into tokens -- identifiers, numbers,
   quoted strings and the symbols ``{ } < > [ ] : ; , -`` -- dropping blanks and ``#``
   comments, and remembering each token's line and column for error messages.
2. The **parser** (``Parser``) is recursive descent: ``parse_message_body`` reads fields until
   the closing brace, and a field whose type is a message calls ``parse_message_body`` again
   for its ``{ ... }``.  Every field name and value is checked against the schema as it is
   read, so an error can point at the exact token.

The variants it accepts (all of protobuf's): ``name: { ... }`` and ``name < ... >``; a repeated
field written several times or as a list ``dim: [1, 3, 224, 224]``; strings in either quote
with C escapes, adjacent strings concatenated (``"a" "b"``); integers in decimal, hex (``0x1F``)
or octal (``017``); floats such as ``1e-4``, ``.5``, ``1.0f``, ``inf``, ``-nan``; booleans as
``true``/``false``/``True``/``False``/``t``/``f``/``1``/``0``; an enum as its value name or
number; ``;`` or ``,`` after a field.

``to_text`` writes a message back out in Caffe's style (two-space indents, fields in number
order), and what it writes parses back to an equal message.
"""

import math
import re

import numpy as np

from minicaffe.errors import PrototxtError
from minicaffe.proto.message import Message
from minicaffe.proto.schema import INT_RANGES, suggest

# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


class Token:
    """One token: ``kind`` is 'ident', 'number', 'string', 'symbol' or 'eof'."""

    __slots__ = ("kind", "text", "line", "column")

    def __init__(self, kind, text, line, column):
        self.kind, self.text, self.line, self.column = kind, text, line, column

    def describe(self):
        """How an error message shows this token: 'end of file', '3', "string \"abc\""."""
        if self.kind == "eof":
            return "end of file"
        if self.kind == "string":
            return f"string {self.text}"
        return f"'{self.text}'"

    def __repr__(self):
        return f"Token({self.kind}, {self.text!r}, {self.line}:{self.column})"


# One alternative per token kind; the tokenizer tries them at the current position.
_TOKEN_RE = re.compile(
    r"""
    (?P<blank>  [ \t\r\f\v]+ )
  | (?P<newline> \n )
  | (?P<comment> \#[^\n]* )
  | (?P<ident>  [A-Za-z_][A-Za-z0-9_]* )
  | (?P<number> 0[xX][0-9A-Fa-f]+
              | (?: [0-9]+ \.? [0-9]* | \.[0-9]+ ) (?: [eE][+-]?[0-9]+ )? [fF]? )
  | (?P<string> "[^"\\\n]* (?: \\. [^"\\\n]* )*"     # unrolled: a run of plain characters per
              | '[^'\\\n]* (?: \\. [^'\\\n]* )*' )   # step, linear in the string's length
  | (?P<symbol> [{}<>\[\]:;,-] )
""",
    re.VERBOSE,
)


class Tokenizer:
    """Turns text into a list of Tokens (ending with an 'eof' token)."""

    def __init__(self, text, filename=None):
        self.text, self.filename = text, filename

    def error(self, message, line, column):
        return PrototxtError(message, self.filename, line, column)

    def tokenize(self):
        text, pos, line, line_start = self.text, 0, 1, 0
        tokens = []
        while pos < len(text):
            m = _TOKEN_RE.match(text, pos)
            column = pos - line_start + 1
            if m is None:
                ch = text[pos]
                if ch in "\"'":
                    raise self.error(
                        f"unterminated string: the {ch} here is not closed before the end of the line", line, column
                    )
                raise self.error(f"unexpected character {ch!r}", line, column)
            kind, end = m.lastgroup, m.end()
            if kind == "newline":
                line, line_start = line + 1, end
            elif kind == "number" and end < len(text) and (text[end].isalnum() or text[end] in "_."):
                bad = re.match(r"[\w.+-]*", text[pos:]).group()
                raise self.error(f"invalid number '{bad}'", line, column)
            elif kind not in ("blank", "comment"):
                tokens.append(Token(kind, m.group(), line, column))
            pos = end
        tokens.append(Token("eof", "", line, pos - line_start + 1))
        return tokens


_SIMPLE_ESCAPES = {
    "n": b"\n",
    "t": b"\t",
    "r": b"\r",
    "\\": b"\\",
    "'": b"'",
    '"': b'"',
    "a": b"\a",
    "b": b"\b",
    "f": b"\f",
    "v": b"\v",
    "?": b"?",
}
_ESCAPE_RE = re.compile(r"\\([0-7]{1,3}|x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)")


def unescape(token, error):
    """The bytes a quoted string token stands for (C escapes resolved, quotes removed)."""
    body = token.text[1:-1]
    out, pos = bytearray(), 0
    for m in _ESCAPE_RE.finditer(body):
        out += body[pos : m.start()].encode("utf-8")
        esc = m.group(1)
        if esc[0] in "01234567":
            out.append(int(esc, 8) & 0xFF)
        elif esc[0] == "x":
            out.append(int(esc[1:], 16))
        elif esc[0] in "uU":
            out += chr(int(esc[1:], 16)).encode("utf-8")
        elif esc in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[esc]
        else:
            raise error(f"unknown escape sequence '\\{esc}' in string", token)
        pos = m.end()
    out += body[pos:].encode("utf-8")
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------------

_BOOL_WORDS = {"true": True, "True": True, "t": True, "false": False, "False": False, "f": False}
_CLOSING = {"{": "}", "<": ">"}


class Parser:
    """Recursive-descent parser of the text format over a token list."""

    def __init__(self, text, filename=None):
        self.filename = filename
        self.tokens = Tokenizer(text, filename).tokenize()
        self.pos = 0

    # -- token helpers --
    def peek(self):
        return self.tokens[self.pos]

    def next(self):
        tok = self.tokens[self.pos]
        if tok.kind != "eof":
            self.pos += 1
        return tok

    def at(self, *symbols):
        tok = self.tokens[self.pos]
        return tok.kind == "symbol" and tok.text in symbols

    def error(self, message, tok):
        return PrototxtError(message, self.filename, tok.line, tok.column)

    def loc(self, tok):
        return (self.filename, tok.line, tok.column)

    # -- grammar --
    def parse(self, type_name):
        msg = Message(type_name)
        msg._locs[None] = (self.filename, 1, 1)
        self.parse_message_body(msg, closing=None, opener=None)
        return msg

    def parse_message_body(self, msg, closing, opener):
        """Fields until ``closing`` ('}' or '>'), or until end of file when closing is None."""
        while True:
            tok = self.peek()
            if tok.kind == "eof":
                if closing is None:
                    return
                raise self.error(
                    f"unterminated message: expected '{closing}' to close the {msg.type_name} "
                    f"opened at line {opener.line}, column {opener.column}, found end of file",
                    tok,
                )
            if tok.kind == "symbol" and tok.text == closing:
                self.next()
                return
            if tok.kind != "ident":
                want = "a field name" + (f" or '{closing}'" if closing else "")
                raise self.error(f"expected {want} in {msg.type_name}, found {tok.describe()}", tok)
            self.parse_field(msg)
            if self.at(";", ","):
                self.next()

    def parse_field(self, msg):
        name_tok = self.next()
        name = name_tok.text
        desc = msg._desc
        field = desc.by_name.get(name)
        if field is None:
            raise self.error(
                f"unknown field '{name}' in {msg.type_name}"
                + suggest(name, desc.by_name, f"fields of {msg.type_name}"),
                name_tok,
            )
        if not field.repeated and name in msg._values:
            first = msg._locs.get(name)
            where = f" (first set at line {first[1]}, column {first[2]})" if first else ""
            raise self.error(
                f"duplicate field '{name}' in {msg.type_name}{where}: "
                f"'{name}' is not a repeated field, so it may appear only once",
                name_tok,
            )
        msg._locs.setdefault(name, self.loc(name_tok))

        colon = self.at(":")
        if colon:
            self.next()
        is_message = field.kind == "message"
        if not colon and not (is_message and self.at("{", "<")):
            raise self.error(
                f"expected ':' or '{{' after field name '{name}', found {self.peek().describe()}", self.peek()
            )
        if colon and self.at("["):  # list syntax: name: [v1, v2, ...]
            open_tok = self.next()
            if not field.repeated:
                raise self.error(
                    f"field '{name}' of {msg.type_name} is not repeated, so it cannot take a list [...]", open_tok
                )
            if self.at("]"):
                self.next()
                return
            while True:
                self.parse_value(msg, field, name_tok)
                if self.at("]"):
                    self.next()
                    return
                if not self.at(","):
                    raise self.error(
                        f"expected ',' or ']' in the list of '{name}', found {self.peek().describe()}", self.peek()
                    )
                self.next()
        self.parse_value(msg, field, name_tok)

    def parse_value(self, msg, field, name_tok):
        """One value of ``field``, stored into ``msg``."""
        if field.kind == "message":
            open_tok = self.peek()
            if not self.at("{", "<"):
                raise self.error(
                    f"expected '{{' to start the {field.type} of field '{field.name}', found {open_tok.describe()}",
                    open_tok,
                )
            self.next()
            value = Message(field.type)
            value._locs[None] = self.loc(name_tok)
            self.parse_message_body(value, _CLOSING[open_tok.text], open_tok)
        else:
            value = self.parse_scalar(field)
        if field.repeated:
            list.append(msg._repeated(field.name), value)
        else:
            msg._values[field.name] = value

    def parse_scalar(self, field):
        tok = self.peek()
        what = f"field '{field.name}' ({field.type_label})"
        t = field.type
        if t in ("string", "bytes"):
            if tok.kind != "string":
                hint = f' (strings are quoted: "{tok.text}")' if tok.kind == "ident" else ""
                raise self.error(f"expected a quoted string for {what}, found {tok.describe()}{hint}", tok)
            data = b""
            while self.peek().kind == "string":  # "adjacent" "strings" concatenate
                data += unescape(self.next(), self.error)
            return data if t == "bytes" else data.decode("utf-8", "surrogateescape")

        negative = False
        if self.at("-"):
            negative = True
            self.next()
            tok = self.peek()
            if tok.kind not in ("number", "ident"):
                raise self.error(f"expected a number after '-' for {what}, found {tok.describe()}", tok)
        if field.kind == "enum":
            self.next()
            if tok.kind == "ident" and not negative:
                if tok.text not in field.enum_values:
                    raise self.error(
                        f"unknown value '{tok.text}' for {what}" + suggest(tok.text, field.enum_values, "values"), tok
                    )
                return tok.text
            if tok.kind == "number" and _is_int(tok.text):
                number = -_int(tok.text) if negative else _int(tok.text)
                if number in field.enum_names:
                    return field.enum_names[number]
                raise self.error(
                    f"{number} is not the number of any value of {what}; known values: {field.enum_values}", tok
                )
            raise self.error(
                f"expected an enum value name for {what}, found "
                f"{tok.describe()}; known values: {', '.join(field.enum_values)}",
                tok,
            )
        if t == "bool":
            self.next()
            if not negative:
                if tok.kind == "ident" and tok.text in _BOOL_WORDS:
                    return _BOOL_WORDS[tok.text]
                if tok.kind == "number" and tok.text in ("0", "1"):
                    return tok.text == "1"
            raise self.error(f"expected true or false for {what}, found {tok.describe()}", tok)
        if t in INT_RANGES:
            self.next()
            if tok.kind != "number" or not _is_int(tok.text):
                raise self.error(f"expected an integer for {what}, found {tok.describe()}", tok)
            value = -_int(tok.text) if negative else _int(tok.text)
            lo, hi = INT_RANGES[t]
            if not lo <= value <= hi:
                raise self.error(f"value {value} is out of range for {what}: must be in [{lo}, {hi}]", tok)
            return value
        # float / double
        self.next()
        if tok.kind == "ident" and tok.text.lower() in ("inf", "infinity", "nan"):
            value = math.nan if tok.text.lower() == "nan" else math.inf
        elif tok.kind == "number":
            text = tok.text
            if _is_int(text):
                value = float(_int(text))
            else:
                value = float(text.rstrip("fF"))
        else:
            raise self.error(f"expected a number for {what}, found {tok.describe()}", tok)
        return -value if negative else value


def _is_int(text):
    """An integer literal: decimal, hex (0x..) or octal (0..)?  (Not 1.5, 1e3, 1f.)"""
    if text[:2] in ("0x", "0X"):
        return True
    return text.isdigit()


def _int(text):
    if text[:2] in ("0x", "0X"):
        return int(text, 16)
    if len(text) > 1 and text[0] == "0":  # C-style octal, as protobuf reads it
        try:
            return int(text, 8)
        except ValueError:
            return int(text, 10)
    return int(text)


def parse(text, type_name="NetParameter", filename=None):
    """Parse prototxt ``text`` as a message of ``type_name``; PrototxtError if malformed."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    return Parser(text, filename).parse(type_name)


def parse_file(path, type_name="NetParameter"):
    """Parse the prototxt file at ``path``; PrototxtError names the file if it cannot be read."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PrototxtError(f"cannot read {type_name} file: {e.strerror or e}", path) from None
    except UnicodeDecodeError as e:
        raise PrototxtError(f"not a text file (invalid UTF-8 at byte {e.start})", path) from None
    return parse(text, type_name, filename=path)


# ---------------------------------------------------------------------------------------------
# Printer
# ---------------------------------------------------------------------------------------------


def format_float(value, type_name="float"):
    """The shortest text that reads back as the same float32 (or float64) value, Caffe-style
    (``1`` not ``1.0``)."""
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if type_name == "float":
        with np.errstate(over="ignore"):  # beyond float32's range: the field holds inf, as Caffe's would
            text = str(np.float32(value))
    else:
        text = repr(value)
    return text[:-2] if text.endswith(".0") else text


_PRINTABLE = {ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r", ord('"'): '\\"', ord("\\"): "\\\\", ord("'"): "\\'"}


def quote(value):
    """A double-quoted, escaped string literal for a str or bytes value."""
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogateescape")
    else:
        data = value
    out = []
    # Decode as far as it is valid UTF-8 so that readable text stays readable; escape the rest.
    text = data.decode("utf-8", "surrogateescape")
    for ch in text:
        code = ord(ch)
        if code in _PRINTABLE:
            out.append(_PRINTABLE[code])
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8
            out.append(f"\\{code - 0xDC00:03o}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\{code:03o}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def format_scalar(field, value):
    t = field.type
    if field.kind == "enum":
        return value
    if t == "bool":
        return "true" if value else "false"
    if t in ("float", "double"):
        return format_float(value, t)
    if t in ("string", "bytes"):
        return quote(value)
    return str(int(value))


def to_text(msg, indent=0):
    """``msg`` in the text format (Caffe's style: two-space indent, fields in number order)."""
    lines = []
    _print_message(msg, indent, lines)
    return "".join(line + "\n" for line in lines)


def _print_message(msg, indent, lines):
    pad = "  " * indent
    desc = msg._desc
    for name, value in msg.fields():
        field = desc.by_name[name]
        values = value if field.repeated else [value]
        if field.kind == "message":
            for sub in values:
                lines.append(f"{pad}{name} {{")
                _print_message(sub, indent + 1, lines)
                lines.append(f"{pad}}}")
        else:
            if isinstance(values, np.ndarray):
                values = values.tolist()
            for v in values:
                lines.append(f"{pad}{name}: {format_scalar(field, v)}")


# ---------------------------------------------------------------------------------------------
# google.protobuf.text_format's functions, for pycaffe scripts
# (``from minicaffe.proto import text_format`` in place of ``from google.protobuf import text_format``)
# ---------------------------------------------------------------------------------------------


def Merge(text, message):  # noqa: N802 (protobuf's names)
    """Parse ``text`` and merge it into ``message`` (which is returned)."""
    message.MergeFrom(parse(text, message.type_name))
    return message


def Parse(text, message):  # noqa: N802
    """Parse ``text`` into ``message``: protobuf merges into what is set, as ``Merge`` does."""
    return Merge(text, message)


def MessageToString(message, **_options):  # noqa: N802
    """``message`` in the text format (protobuf's printing options are accepted and ignored)."""
    return to_text(message)
