# attnkit serve on a CPU: one trained model behind HTTP, the checkpoint mounted at run time.
#
#   docker build -t attnkit-serve .
#   docker run --rm -p 8000:8000 -v "$PWD/runs/quickstart:/model:ro" attnkit-serve
#   curl -s localhost:8000/translator/translate -H 'Content-Type: application/json' -d '[{"src": "March 3, 2001"}]'
#
# /model is a checkpoint folder or a run directory (its best checkpoint), or, with `--engine
# ctranslate2` after the image's name, a folder from `attnkit export --to ctranslate2`. Anything after the
# image's name goes to `attnkit serve` (decode.beam_size=4, --max-wait-ms 20, ...); -e ATTNKIT_API_KEY=...
# requires a key. `docker stop` sends SIGTERM: the server answers what it has accepted (for up to
# --grace 30 s; give docker as long: `docker stop -t 35`) and exits 0. docs/serving.md says more.
FROM python:3.11-slim

# PyTorch's CPU-only build: PyPI's default build brings several GB of CUDA libraries a CPU never uses.
ARG TORCH_VERSION=2.13.0
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu

# tcmalloc, which the engine's worker processes start with (--allocator auto): a running batch ~15% faster
# than with glibc's malloc.
RUN apt-get update && apt-get install -y --no-install-recommends libtcmalloc-minimal4 \
    && rm -rf /var/lib/apt/lists/*

# attnkit with its server (FastAPI, uvicorn, prometheus-client) and CTranslate2 (--engine ctranslate2).
COPY pyproject.toml README.md /tmp/attnkit/
COPY src /tmp/attnkit/src
RUN pip install --no-cache-dir "/tmp/attnkit[serve,ctranslate2]" && rm -rf /tmp/attnkit

# Not root: the model is only read (mount it read-only).
RUN useradd --create-home --uid 1000 attnkit
USER attnkit
WORKDIR /home/attnkit

EXPOSE 8000
# Healthy once the model is loaded: /health answers 503 until then.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
# Every network of the container (its port is published by `docker run -p`); 127.0.0.1 inside a
# container would answer nobody.
ENTRYPOINT ["attnkit", "serve", "--ckpt", "/model", "--host", "0.0.0.0", "--port", "8000"]
