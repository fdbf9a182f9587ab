"""Which of a saved step's kept guards refused a call.

torch words a refusal as `GuardManager check failed, reason: GuardDebugInfo(result=0,
verbose_code_parts=[...])`. For its guard on shapes the list holds every symbolic relation it kept (27 on a
one-layer Qwen3), so the first listed is not the one that failed: on an H200 the summary named
`mask.stride()[0] == mask.size()[3]`, which held, where the failed one was `mask.size()[0] != 1` (SDPA's).
Each part is a Python expression over the call's frame (`L['inputs'][...]`); this module reads them without
eval: a part is parsed (ast) and walked over a short list of node kinds (names of the frame, subscripts,
attributes, `.size()` / `.stride()`, integer arithmetic, comparisons, and / or / not); a part with any other
node (a call of anything else, a lambda, ...) is not evaluated and is passed over.
"""

import ast
import io
import operator
import tokenize

_MARK = "verbose_code_parts="
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
               ast.Mod: operator.mod}
_SHAPE_CALLS = ("size", "stride")  # the only methods called: no arguments, on a tensor


class _NotReadable(Exception):
    """A part with a node outside the list: passed over."""


def listed_parts(message: str) -> list[str]:
    """The code parts of a refusal's message, in torch's order (each without its `  # where` comment); [] if the
    message lists none. The list is read as Python string tokens, so a quote inside a part does not cut it."""
    start = message.find(_MARK)
    if start < 0:
        return []
    parts, depth = [], 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(message[start + len(_MARK):]).readline):
            if token.type == tokenize.OP and token.string in "[(":
                depth += 1
            elif token.type == tokenize.OP and token.string in "])":
                depth -= 1
                if depth == 0:
                    break
            elif token.type == tokenize.STRING and depth == 1:
                parts.append(ast.literal_eval(token.string).split("  #")[0].strip())
    except (tokenize.TokenError, SyntaxError, ValueError):
        pass  # a message cut short: the parts read so far
    return parts


def failed_part(message: str, frame: dict) -> str | None:
    """The first listed part that is false on `frame` (the refused call's locals, e.g. {'inputs': ...}), or None
    where none is found false (every readable part held, or none could be read)."""
    for part in listed_parts(message):
        try:
            if _value(ast.parse(part, mode="eval").body, frame) is False:
                return part
        except (_NotReadable, SyntaxError, LookupError, AttributeError, TypeError, ZeroDivisionError):
            continue
    return None


def _value(node: ast.AST, frame: dict):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, str)):
        return node.value
    if isinstance(node, ast.Name) and node.id == "L":
        return frame
    if isinstance(node, ast.Subscript):
        return _value(node.value, frame)[_value(node.slice, frame)]
    if isinstance(node, ast.Attribute) and not node.attr.startswith("_"):
        return getattr(_value(node.value, frame), node.attr)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _SHAPE_CALLS
            and not node.args and not node.keywords):
        return tuple(getattr(_value(node.func.value, frame), node.func.attr)())
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_value(node.left, frame), _value(node.right, frame))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        operand = _value(node.operand, frame)
        return -operand if isinstance(node.op, ast.USub) else not operand
    if isinstance(node, ast.BoolOp):
        values = [_value(v, frame) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        return _compare(node, frame)
    raise _NotReadable(type(node).__name__)


def _compare(node: ast.Compare, frame: dict) -> bool:
    """A chain such as `2 <= a <= 7`: every link holds."""
    left = _value(node.left, frame)
    for op, right_node in zip(node.ops, node.comparators):
        if type(op) not in _COMPARE:
            raise _NotReadable(type(op).__name__)
        right = _value(right_node, frame)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True
