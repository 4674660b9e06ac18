import os

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
    import tempfile
    os.environ["DELEGATE_PROFILE_DIR"] = tempfile.mkdtemp(prefix="delegate-test-profiles-")
