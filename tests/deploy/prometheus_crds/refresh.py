"""Refresh the vendored PodMonitor CRD schema from a clone of prometheus-operator.

    git clone https://github.com/prometheus-operator/prometheus-operator /tmp/prometheus-operator
    python tests/deploy/prometheus_crds/refresh.py /tmp/prometheus-operator v0.93.0

Keeps only the `v1` version's `schema.openAPIV3Schema` of
`example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml` at the given tag,
without its descriptions (most of the file's size), as `podmonitors.v1.json.gz` (sorted
keys, gzip with no timestamp: the same input gives the same bytes), and records the
tag, commit and the source file's SHA-256 in `source.json`. Then run tests/deploy and
bump the version in README.md beside this file.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml"
OUT = "podmonitors.v1.json.gz"
VERSION = "v1"


def git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def without_descriptions(node):
    """The schema less its `description` texts (a property named "description" stays)."""
    if isinstance(node, list):
        return [without_descriptions(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: without_descriptions(sub) for name, sub in value.items()}
        elif key != "description":
            out[key] = without_descriptions(value)
    return out


def main(repo: str, tag: str) -> None:
    repo_path = Path(repo)
    commit = git(repo_path, "rev-parse", f"{tag}^{{commit}}").decode().strip()
    raw = git(repo_path, "show", f"{commit}:{SOURCE}")
    crd = yaml.safe_load(raw)
    [schema] = [v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == VERSION]
    text = json.dumps(without_descriptions(schema), sort_keys=True, separators=(",", ":")).encode()
    out = HERE / OUT
    out.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
    print(f"{out.name}: {len(text):,} bytes of JSON, {out.stat().st_size:,} gzipped")
    source = {"repository": "prometheus-operator/prometheus-operator", "tag": tag, "commit": commit,
              "version": VERSION, "files": {OUT: {"source": SOURCE, "source_sha256": hashlib.sha256(raw).hexdigest()}}}
    (HERE / "source.json").write_text(json.dumps(source, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
