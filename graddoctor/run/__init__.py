"""The run side: a run's life from its start to its one ``Report``.

``session`` (the ``Session`` every front door enters) -> ``target`` (the script run like
``python`` would) and, for the processes a run spans, ``workers`` / ``in_worker`` (spawned
multiprocessing workers) and ``ranks`` (the ranks of a distributed run); ``atfork`` holds the
one handler a forked child runs. Nothing here is imported by ``import graddoctor``.
"""
