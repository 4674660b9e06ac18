"""A third-party backend plugin used by the tests to exercise the plugin contract end to end."""
