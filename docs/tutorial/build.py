"""Put the tutorial's code into its page, so the page shows only code CI has run.

Each `<!-- code: FILE -->` or `<!-- code: FILE REGION -->` line of first-agent.md is followed
by a fenced block: the text of FILE (beside this script), or of its REGION, the lines
between `# --8<-- [start:REGION]` and `# --8<-- [end:REGION]` (dedented; other markers
dropped). `python docs/tutorial/build.py` rewrites those blocks; with `--check` it changes
nothing and exits 1 when the page differs from its files (tests/contracts/test_tutorial.py).
"""

import re
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAGE = HERE / "first-agent.md"
MARKER = re.compile(r"^# --8<-- \[(start|end):([\w-]+)\]$")
BLOCK = re.compile(
    r"^(<!-- code: (?P<file>[\w.-]+)(?: (?P<region>[\w-]+))? -->\n)```(?P<lang>\w*)\n.*?^```$",
    re.MULTILINE | re.DOTALL,
)


def code(file: str, region: str | None) -> str:
    lines = (HERE / file).read_text(encoding="utf-8").splitlines()
    if region is not None:
        starts = [n for n, line in enumerate(lines) if line.strip() == f"# --8<-- [start:{region}]"]
        ends = [n for n, line in enumerate(lines) if line.strip() == f"# --8<-- [end:{region}]"]
        if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
            raise ValueError(f"{file}: region {region!r} must be marked once, start before end")
        lines = lines[starts[0] + 1 : ends[0]]
    kept = [line for line in lines if not MARKER.match(line.strip())]
    return textwrap.dedent("\n".join(kept)).strip("\n")


def built(page: str) -> str:
    def fill(match):
        body = code(match["file"], match["region"])
        return f"{match.group(1)}```{match['lang'] or 'python'}\n{body}\n```"

    return BLOCK.sub(fill, page)


def main(argv) -> int:
    page = PAGE.read_text(encoding="utf-8")
    fresh = built(page)
    if "--check" in argv:
        if fresh != page:
            print(f"{PAGE} differs from its code: run python docs/tutorial/build.py")
            return 1
        return 0
    PAGE.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
