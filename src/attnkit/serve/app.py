"""The HTTP server of one trained model: a FastAPI app assembled from its parts.

- the server's state, on ``app.state.server`` (serve/state.py): settings, metrics, the model and its
  batcher once loaded;
- the endpoints, one router per dialect (serve/endpoints/): ``/health``, ``/info``, ``/metrics`` and
  ``/explore`` on every server, and those the served model speaks (``ServedModel.dialects``);
- every error in one format (serve/errors.py);
- what every request passes first (serve/middleware.py): counted by route, and refused for a wrong
  ``Host``, a missing API key or a body over the size limit; the hot paths then called directly.

The model loads in a thread once the server starts, so that ``/health`` answers "loading" meanwhile;
a translator's compiled steps, where they are not built yet, are built in the background once it
serves (serve/building.py).
Every bound the server keeps, with its default and its error, is listed in docs/serving.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from importlib.metadata import version

from fastapi import FastAPI

from attnkit.serve.building import StepsBuilding
from attnkit.serve.endpoints import DIRECT, EVERY_SERVER, ROUTERS
from attnkit.serve.errors import handle_errors
from attnkit.serve.middleware import CountRequests, Direct, Guard
from attnkit.serve.served import ServedModel
from attnkit.serve.state import LOG, ServerState, ServeSettings


def make_app(
    served: type[ServedModel],
    load: Callable[[], ServedModel],
    settings: ServeSettings,
    stopping: Callable[[], bool] = lambda: False,
) -> FastAPI:
    """The app serving the model that ``load()`` returns, of the class ``served`` (which says the
    endpoints it answers). ``stopping()`` says whether the server is shutting down (a request cut off
    then is told so; otherwise its client has gone)."""
    server = ServerState(settings, stopping)
    # the interactive docs (/docs, /redoc) would load their scripts from a CDN: off; /openapi.json stays
    app = FastAPI(title="attnkit", version=version("attnkit"), lifespan=_serving(server, load),
                  docs_url=None, redoc_url=None)  # fmt: skip
    app.state.server = server
    handle_errors(app, server.metrics)
    # the model's own endpoints first: FastAPI tries the routers in order, and these take the load
    routers = (*(ROUTERS[dialect] for dialect in served.dialects), *EVERY_SERVER)
    for router in routers:
        app.include_router(router)
    # every path served (FastAPI's own, /openapi.json, too), for the counting; Guard runs inside it
    paths = {route.path for router in routers for route in router.routes}
    paths |= {route.path for route in app.routes if hasattr(route, "path")}
    # the hot paths past FastAPI's routing (the served model's among them only), inside the guard
    direct = {(method, route.path): route.endpoint for router in routers for route in router.routes
              if route.endpoint in DIRECT for method in route.methods}  # fmt: skip
    app.add_middleware(Direct, metrics=server.metrics, routes=direct)
    app.add_middleware(Guard, metrics=server.metrics, api_key=settings.api_key,
                       max_body_bytes=settings.max_body_bytes, hosts=settings.hosts)  # fmt: skip
    app.add_middleware(CountRequests, metrics=server.metrics, routes=frozenset(paths))
    return app


def _serving(server: ServerState, load: Callable[[], ServedModel]) -> Callable:
    """The app's lifespan: the model loads in a thread and is served once loaded (or ``/health`` says
    why not); the batcher stops when the server does."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def loading() -> None:
            try:
                model = load()
                batcher = server.batcher_for(model)
                batcher.started()  # its worker processes have loaded the model too
            except Exception as error:  # said by /health; the server stays up to say it
                server.failed = str(error)
                return
            try:  # decode.steps=auto: compiled steps built while the model's own serve
                builder = model.steps_builder(LOG.warning)
                if builder is not None:
                    server.building = StepsBuilding(builder)
            except Exception as error:  # the server serves all the same
                LOG.warning("decode.steps=auto: the compiled steps' build could not start (%s: %s); the "
                            "model's own steps serve", type(error).__name__, error)  # fmt: skip
            loop.call_soon_threadsafe(server.start, model, batcher)

        threading.Thread(target=loading, name="attnkit-load", daemon=True).start()
        yield
        if server.building is not None:
            server.building.stop()
        if server.batcher is not None:
            await server.batcher.stop()

    return lifespan
