"""Helpers shared by the tests: free ports and waits (net), an app served in a thread (app_thread),
the real CLI in a subprocess (cli)."""
