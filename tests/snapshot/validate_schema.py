#!/usr/bin/python3
"""Validate snapshots against the JSON Schema (docs/snapshot.schema.json).

    validate_schema.py SCHEMA DIR [SNAPGEN]

Every *.json file in DIR (written by test_snapshot) must validate; with
SNAPGEN (pp_snapgen), snapshots it writes (with streams, several threads,
with and without symbols) are validated too, as is the hand-written example
of the format document. Uses python3-jsonschema (Debian), draft-07.
"""
import json
import os
import subprocess
import sys
import tempfile

import jsonschema


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    schema = json.load(open(sys.argv[1]))
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    files = sorted(os.path.join(sys.argv[2], f) for f in os.listdir(sys.argv[2])
                   if f.endswith(".json"))
    if not files:
        print(f"no snapshots in {sys.argv[2]}", file=sys.stderr)
        return 1
    here = os.path.dirname(os.path.abspath(__file__))
    files.append(os.path.join(here, "example.json"))
    with tempfile.TemporaryDirectory() as tmp:
        if len(sys.argv) > 3:
            runs = [["--streams", "--live", "400"],
                    ["--threads", "4", "--live", "800", "--no-symbols"],
                    ["--history", "100", "--churn", "5"]]
            for i, extra in enumerate(runs):
                out = os.path.join(tmp, f"snapgen-{i}.json")
                subprocess.run([sys.argv[3], out] + extra, check=True)
                files.append(out)
        bad = 0
        for path in files:
            errors = list(validator.iter_errors(json.load(open(path))))
            for e in errors[:3]:
                where = "/".join(str(p) for p in e.absolute_path)
                print(f"{path}: {where}: {e.message}", file=sys.stderr)
            bad += bool(errors)
    print(f"snapshot_schema: {len(files) - bad} of {len(files)} snapshots "
          f"valid against {os.path.basename(sys.argv[1])}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
