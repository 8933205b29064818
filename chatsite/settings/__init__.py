"""Settings package: ``base`` holds everything read from the environment; ``dev``, ``test`` and ``prod``
adjust only what differs between those deployments."""
