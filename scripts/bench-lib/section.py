"""Writes one section of BENCHMARKS.md, the text from `<!-- NAME:begin -->` to
`<!-- NAME:end -->`: the section's new text (which starts with the one marker and ends with the
other) replaces it, literally (no backslash escapes); a file without that section gets it
appended after a blank line. A missing file starts as "# Benchmarks".

    section.py NAME FILE [TARGET]     FILE's text (its trailing newlines dropped) as the section
                                      NAME of TARGET (BENCHMARKS.md unless given)

The bench scripts call it as `write_section NAME FILE` (scripts/bench-lib/common.sh); their
Python reports call `write_section(NAME, TEXT)` (`from section import write_section`).
"""

import os
import re
import sys


def replace(text, name, sec):
    """text with the section NAME replaced by sec, or sec appended."""
    begin, end = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
    if not (sec.startswith(begin) and sec.endswith(end)):
        raise ValueError("the %s section must start with %s and end with %s" % (name, begin, end))
    new, found = re.subn(re.escape(begin) + r".*?" + re.escape(end), lambda _: sec, text, flags=re.S)
    if found:
        return new
    return text.rstrip("\n") + "\n\n" + sec + "\n"


def write_section(name, sec, path="BENCHMARKS.md"):
    """Writes sec as the section NAME of the file at path."""
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    text = replace(text, name, sec)
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    try:
        write_section(sys.argv[1], open(sys.argv[2]).read().rstrip("\n"), *sys.argv[3:])
    except ValueError as e:
        sys.exit("section.py: %s" % e)
