"""Serving a trained model over HTTP (``attnkit serve``): the app (``app.py``), dynamic batching
(``batcher.py``), and the model as the server runs it (``served.py``; ``translator.py`` for translation
and summarisation, ``generator.py`` with ``generation.py``'s endpoints for decoders, ``predictor.py`` for
encoders)."""
