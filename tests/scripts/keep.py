"""Scripts run in-process by the tests put their objects here, so the tests can inspect them."""
objects = []
