"""A rule's regex, bounded: Python's backtracking matcher has no timeout, so a pattern is
accepted only when its worst case on any accepted argument stays within milliseconds."""

import re
from functools import lru_cache
from re import _constants as sre
from re import _parser as sre_parser  # the stdlib's own parser: a pattern's structure

# The bounds below keep the worst case of any accepted pattern on any accepted argument to
# milliseconds, where an unbounded `.*a.*a.*a.*c` can take minutes.
MAX_PATTERN = 200  # characters of a pattern
MAX_MATCHED = 1000  # characters of an argument a regex is tried on; a longer one is not judged
MAX_STEPS = 10**7  # backtracking paths a pattern may have on a MAX_MATCHED-character argument


@lru_cache(maxsize=1024)
def compiled(pattern: str) -> re.Pattern:
    """The pattern compiled, once per process; ValueError if it is too long, does not
    compile, or could backtrack for too long (see MAX_STEPS)."""
    if len(pattern) > MAX_PATTERN:
        raise ValueError(
            f"regex is {len(pattern)} characters long; a pattern is at most {MAX_PATTERN}"
        )
    try:
        parsed = sre_parser.parse(pattern)
        result = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"regex {pattern!r} does not compile: {exc}") from None
    steps = _steps(parsed, pattern)
    if steps > MAX_STEPS:
        raise ValueError(
            f"regex {pattern!r} could backtrack through about {steps:.0e} paths on a "
            f"{MAX_MATCHED}-character argument, more than {MAX_STEPS:.0e}: use at most two "
            f"repeats (*, +, {{m,n}}) with a few alternatives or optional parts beside them"
        )
    return result


_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)


def _steps(items, pattern) -> int:
    """An upper bound on the paths a backtracking matcher may try: each repeat multiplies
    them by the lengths it can take, an alternation by its alternatives. A repeated part that
    itself varies (`(a+)+`, `(\\w+\\s?)*`, `(ab|a)*`) is exponential in the argument's length,
    so it is refused outright."""
    total = 1
    for op, av in items:
        if op in _REPEATS:
            low, high, item = av
            inner = _steps(item, pattern)
            if high > 1 and inner > 1:
                raise ValueError(
                    f"regex {pattern!r} repeats a part that itself repeats or alternates "
                    f"(like (a+)+ or (ab|a)*), which can take exponential time; write the "
                    f"repeated part as a fixed sequence or a character class"
                )
            total *= (min(high, MAX_MATCHED) - min(low, MAX_MATCHED) + 1) * inner
        elif op is sre.BRANCH:
            total *= sum(_steps(alternative, pattern) for alternative in av[1])
        elif op is sre.SUBPATTERN:
            total *= _steps(av[3], pattern)
        elif op in (sre.ASSERT, sre.ASSERT_NOT):
            total *= _steps(av[1], pattern)
        elif op is sre.ATOMIC_GROUP:
            total *= _steps(av, pattern)
        elif op is sre.GROUPREF_EXISTS:
            total *= _steps(av[1], pattern) + (_steps(av[2], pattern) if av[2] else 1)
    return total
