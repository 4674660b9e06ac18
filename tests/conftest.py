import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings

# CI runs a short derandomized profile; DELEGATE_HYPOTHESIS=thorough for a longer local run.
settings.register_profile("ci", max_examples=15, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("DELEGATE_HYPOTHESIS", "ci"))

# Cost profiles and stored placement decisions go to a directory of the test run, never the user's cache
# (a test's bench refits profiles; a stored decision would change later tests' plans).
if "DELEGATE_PROFILE_DIR" not in os.environ:
    os.environ["DELEGATE_PROFILE_DIR"] = tempfile.mkdtemp(prefix="delegate-test-profiles-")
    atexit.register(shutil.rmtree, os.environ["DELEGATE_PROFILE_DIR"], ignore_errors=True)


def _register_fake_plugin() -> None:
    """Make tests/fake_plugin discoverable for this run only, the way an installed third-party plugin is.

    Its package directory and a generated ``.dist-info`` (entry points copied from its pyproject.toml) go on
    ``sys.path`` and on ``PYTHONPATH`` for the CLI subprocesses, so discovery runs through the ordinary
    ``delegate.backends`` entry point and nothing is installed into the user's environment.
    """
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    source = Path(__file__).parent / "fake_plugin"
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    made = tempfile.mkdtemp(prefix="delegate-test-plugins-")
    atexit.register(shutil.rmtree, made, ignore_errors=True)  # the run's own directory, gone with the run
    dist = Path(made) / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in eps.items()) + "\n"
        for group, eps in groups.items()))
    paths = [str(source), str(dist.parent)]
    sys.path[:0] = paths
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])


_register_fake_plugin()
