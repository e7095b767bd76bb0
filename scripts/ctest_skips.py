#!/usr/bin/env python3
"""Lists the tests a CTest run skipped, with each one's reason.

    ctest_skips.py JUNIT_XML    (ctest --output-junit JUNIT_XML)

Prints one line per skipped test, "name: reason", where the reason is the line the test
printed that starts with "SKIP" (the project's convention, e.g. "SKIP: no Python with the
tensorboard package"), else its last line of output. Exits 0 whether or not any test
skipped; an unreadable file is an error (exit 2).
"""
import sys
import xml.etree.ElementTree as ElementTree


def reason(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("SKIP"):
            return line
    return lines[-1] if lines else "(no output)"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        root = ElementTree.parse(sys.argv[1]).getroot()
    except (OSError, ElementTree.ParseError) as error:
        print(f"ctest_skips.py: cannot read {sys.argv[1]}: {error}", file=sys.stderr)
        return 2
    for case in root.iter("testcase"):
        if case.get("status") not in ("notrun", "disabled") and case.find("skipped") is None:
            continue
        out = case.find("system-out")
        print(f"{case.get('name')}: {reason(out.text or '' if out is not None else '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
