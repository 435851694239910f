"""Refresh the vendored KubeRay CRD schemas from a clone of ray-project/kuberay.

    git clone https://github.com/ray-project/kuberay /tmp/kuberay
    python tests/deploy/kuberay_crds/refresh.py /tmp/kuberay v1.7.0

For each of ray.io_rayclusters / rayjobs / rayservices in
`ray-operator/config/crd/bases/` at the given tag, this keeps only the `v1` version's
`schema.openAPIV3Schema` and writes it as `<plural>.v1.json.gz` (sorted keys, gzip with
no timestamp, so the same input gives the same bytes), then records the tag, commit and
the source files' SHA-256 in `source.json`. Then run tests/deploy and bump the KubeRay
version in README.md beside this file.
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
CRD_DIR = "ray-operator/config/crd/bases"
PLURALS = ("rayclusters", "rayjobs", "rayservices")
VERSION = "v1"


def git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def v1_schema(crd: dict) -> dict:
    for version in crd["spec"]["versions"]:
        if version["name"] == VERSION:
            return version["schema"]["openAPIV3Schema"]
    raise SystemExit(f"{crd['metadata']['name']} has no {VERSION} version")


def main(repo: str, tag: str) -> None:
    repo_path = Path(repo)
    commit = git(repo_path, "rev-parse", f"{tag}^{{commit}}").decode().strip()
    files = {}
    for plural in PLURALS:
        path = f"{CRD_DIR}/ray.io_{plural}.yaml"
        raw = git(repo_path, "show", f"{commit}:{path}")
        schema = v1_schema(yaml.safe_load(raw))
        text = json.dumps(schema, sort_keys=True, separators=(",", ":")).encode()
        out = HERE / f"{plural}.{VERSION}.json.gz"
        out.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
        files[out.name] = {"source": path, "source_sha256": hashlib.sha256(raw).hexdigest()}
        print(f"{out.name}: {len(text):,} bytes of JSON, {out.stat().st_size:,} gzipped")
    source = {"repository": "ray-project/kuberay", "tag": tag, "commit": commit,
              "version": VERSION, "files": files}
    (HERE / "source.json").write_text(json.dumps(source, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
