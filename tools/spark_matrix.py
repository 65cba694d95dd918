"""Run the Spark tests on several pyspark versions, one virtualenv per version.

    .venv/bin/python tools/spark_matrix.py                  # 4.0.5 4.1.4 4.2.1 (make spark-matrix)
    .venv/bin/python tools/spark_matrix.py 4.0.5 4.3.0      # chosen versions

Each version gets ``build/spark-matrix/pyspark-<version>`` (``--venv-dir`` moves it), created on
first use from this interpreter with ``pyspark==<version>`` and the other requirements of
pyproject.toml's runtime, ``test`` and ``spark`` sets; it is rebuilt when those change. segstore
is not installed there: the runs import this checkout (``PYTHONPATH``), with the extension built
in place by this interpreter, so every venv must be of its Python version. The versions run one
after another (Spark takes both cores); ``tests/spark`` and the Spark examples of
``docs/spark.md`` run in each. The exit status is 1 if any run failed.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import sysconfig
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_VERSIONS = ["4.0.5", "4.1.4", "4.2.1"]
TESTS = ["tests/spark", "tests/test_docs_examples.py", "-m", "spark"]
MARKER = ".segstore-matrix"
_SUMMARY = re.compile(r"^=* ?(\d+ (passed|failed|skipped|errors?|deselected).*) in [\d.]+s")


def requirements(version: str) -> list:
    """pyspark at ``version`` plus pyproject's runtime, test and spark requirements."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    reqs = project["dependencies"] + extras["test"] + extras["spark"]
    return [f"pyspark=={version}"] + [r for r in reqs if not r.startswith("pyspark")]


def ensure_venv(venv: str, reqs: list) -> str:
    """The venv's python, creating or refreshing the venv when its requirements differ."""
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, MARKER)
    wanted = "\n".join(reqs) + "\n"
    if os.path.exists(marker):
        with open(marker) as f:
            if f.read() == wanted:
                return python
    print(f"== creating {venv}: {' '.join(reqs)}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", *reqs], check=True)
    with open(marker, "w") as f:
        f.write(wanted)
    return python


def check_extension() -> None:
    """The in-place extension this interpreter built: the venvs import it from the checkout."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if not glob.glob(os.path.join(ROOT, "segstore", "_core" + suffix)):
        sys.exit(f"segstore/_core{suffix} is missing: run `make install` or "
                 f"`{sys.executable} setup.py build_ext --inplace` first")


def run_tests(python: str, pytest_args: list) -> tuple:
    """(exit status, pytest's summary line) of one version's run; output goes to the terminal."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *TESTS, *pytest_args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    summary = "no summary line"
    for line in proc.stdout:
        sys.stdout.write(line)
        m = _SUMMARY.match(line.strip())
        if m:
            summary = m.group(1)
    return proc.wait(), summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", default=DEFAULT_VERSIONS,
                        help="pyspark versions (default: %(default)s)")
    parser.add_argument("--venv-dir", default=os.path.join(ROOT, "build", "spark-matrix"))
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    args = parser.parse_args(argv)
    check_extension()
    results = []
    for version in args.versions:
        python = ensure_venv(os.path.join(args.venv_dir, f"pyspark-{version}"),
                             requirements(version))
        print(f"== pyspark {version}", flush=True)
        results.append((version, *run_tests(python, args.pytest_args.split())))
    print("\n== Spark tests per pyspark version")
    for version, status, summary in results:
        print(f"pyspark {version}: {'ok' if status == 0 else 'FAILED'} ({summary})")
    return 0 if all(status == 0 for _, status, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
