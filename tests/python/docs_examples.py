"""The Python examples of docs/python.md: every ```python block, in order.

    python3 tests/python/docs_examples.py OUTDIR   # one file per example

test_docs.py runs them; tests/python/package.sh writes them out for mypy,
so that the examples are both run and type-checked. Each block is a whole
program (its own imports); a block meant only as an illustration is not
written as ```python.
"""

import os
import re
import sys

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                   "docs", "python.md")


def examples(path=DOC):
    """[(line, code)] of each ```python block of path."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
        out.append((text.count("\n", 0, m.start()) + 2, m.group(1)))
    return out


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    for i, (line, code) in enumerate(examples()):
        name = os.path.join(outdir, f"python_md_{i:02d}_line{line}.py")
        with open(name, "w", encoding="utf-8") as f:
            f.write(code)
        print(name)


if __name__ == "__main__":
    main(sys.argv[1])
