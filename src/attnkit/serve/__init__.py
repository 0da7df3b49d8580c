"""Serving a trained model over HTTP (``attnkit serve``): the app (``app.py``), dynamic batching
(``batcher.py``), and the model as the server runs it (``served.py``; ``translator.py`` for translation
and summarisation, ``predictor.py`` for encoders)."""
