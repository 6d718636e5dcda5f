"""A replica's error body in OpenAI's shape: status-driven type, string or
null code, the replica's message and param kept."""

import orjson
import pytest

from gateway.replica_errors import openai_error_body

VLLM_NEW = b'{"error":{"message":"max_tokens must be at least 1, got -1.","type":"BadRequestError","param":"max_tokens","code":400}}'
VLLM_OLD = b'{"object":"error","message":"This model\'s maximum context length is 2048 tokens.","type":"BadRequestError","param":null,"code":400}'

CASES = [
    (400, VLLM_NEW, "invalid_request_error", "max_tokens must be at least 1, got -1.", "max_tokens", None),
    (400, VLLM_OLD, "invalid_request_error", "This model's maximum context length is 2048 tokens.", None, None),
    (401, b'{"error":{"message":"Unauthorized","type":"Unauthorized","code":401}}', "authentication_error", "Unauthorized", None, None),
    (403, b'{"error":{"message":"no","type":"x","code":403}}', "permission_error", "no", None, None),
    (404, b'{"error":{"message":"The model `x` does not exist.","type":"NotFoundError","param":"model","code":404}}', "not_found_error", "The model `x` does not exist.", "model", None),
    (413, b'{"error":{"message":"too big"}}', "invalid_request_error", "too big", None, None),
    (422, b'{"detail":[{"loc":["body","n"]}]}', "invalid_request_error", '{"detail":[{"loc":["body","n"]}]}', None, None),
    (429, b'{"error":{"message":"slow down","type":"rate_limit_exceeded","code":"rate_limit_exceeded"}}', "rate_limit_error", "slow down", None, "rate_limit_exceeded"),
    (500, b'{"error":{"message":"engine dead","type":"InternalServerError","code":500}}', "server_error", "engine dead", None, None),
    (503, b"<html>Service Unavailable</html>", "server_error", "<html>Service Unavailable</html>", None, None),
    (400, b'{"error":"plain string error"}', "invalid_request_error", "plain string error", None, None),
    (400, b"[1,2]", "invalid_request_error", "[1,2]", None, None),
    (400, b"", "invalid_request_error", "The model replica answered 400.", None, None),
]


@pytest.mark.parametrize("status,data,typ,message,param,code", CASES)
def test_openai_shape(status, data, typ, message, param, code):
    err = orjson.loads(openai_error_body(status, data))
    assert set(err) == {"error"}
    assert err["error"] == {"message": message, "type": typ, "param": param, "code": code}


def test_long_message_capped():
    err = orjson.loads(openai_error_body(400, orjson.dumps({"error": {"message": "x" * 10000}})))["error"]
    assert err["message"] == "x" * 4000
