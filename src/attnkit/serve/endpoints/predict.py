"""``POST /predict``, for encoder models: ``{"inputs": [TEXT, ...]}`` -> ``{"outputs": [...]}``, one per
input, what ``attnkit predict`` prints as JSON (a classifier's label and probability, a
question-answering model's answer, a masked-LM's tokens for each mask)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from attnkit.serve.bodies import PredictBody
from attnkit.serve.errors import RequestError
from attnkit.serve.state import server_of

router = APIRouter()


@router.post("/predict")
async def predict(request: Request, body: PredictBody) -> dict:
    server = server_of(request)
    predictor = server.ready_model()
    problem = predictor.problem(body.inputs)
    if problem:
        raise RequestError(422, "invalid_request", problem)
    tokens = await server.token_counts(predictor, body.inputs)
    server.check_lengths(tokens, predictor.max_tokens, "inputs")
    positions = predictor.positions(tokens, None)
    server.check_positions(positions)
    lines = await server.batched(request, body.inputs, None, sum(tokens), positions)
    return {"outputs": [predictor.as_json(line) for line in lines]}
