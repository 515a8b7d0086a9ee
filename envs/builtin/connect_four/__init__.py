"""Built-in Connect Four: the game (``game``), its fixed opponents' move functions (``baselines``, with the
``negamax`` search) and the named baseline players built on them (``players``)."""
