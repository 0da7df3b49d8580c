"""The server's endpoints, one router per dialect, each handler a module-level function that reads the
server's state (``app.state.server``, serve/state.py).

- :mod:`~attnkit.serve.endpoints.operations`: ``/health``, ``/info``, ``/metrics`` (every server);
- :mod:`~attnkit.serve.endpoints.explore`: ``/explore``, the attention explorer (every server);
- :mod:`~attnkit.serve.endpoints.opennmt`: ``/translator/translate`` (translation, summarisation);
- :mod:`~attnkit.serve.endpoints.predict`: ``/predict`` (encoders);
- :mod:`~attnkit.serve.endpoints.uploads`: ``/predict`` and ``POST /explore`` with uploaded files
  (captioners' images, speech recognisers' WAV files);
- :mod:`~attnkit.serve.endpoints.tgi` and :mod:`~attnkit.serve.endpoints.openai`: ``/generate``,
  ``/generate_stream`` and ``/v1/completions`` (decoders), sharing :mod:`~attnkit.serve.endpoints.sampling`.

A served model names the dialects it speaks (``ServedModel.dialects``); :data:`ROUTERS` maps each to its
router. The handlers in :data:`DIRECT` read their own request and make their own response: the app calls
them past FastAPI's routing (serve/middleware.py, ``Direct``).
"""

from __future__ import annotations

from fastapi import APIRouter

from attnkit.serve.endpoints import explore, openai, opennmt, operations, predict, tgi, uploads

EVERY_SERVER: tuple[APIRouter, ...] = (operations.router, explore.router)
ROUTERS: dict[str, APIRouter] = {
    "opennmt": opennmt.router,
    "predict": predict.router,
    "uploads": uploads.router,
    "tgi": tgi.router,
    "openai": openai.router,
}

# handlers whose one parameter is the request and whose answer is a response: the server's hot paths
DIRECT = frozenset({opennmt.translate})
