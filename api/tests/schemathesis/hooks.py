"""What the OpenAPI document cannot say, told to schemathesis (loaded by the repository's schemathesis.toml).

`POST /v1/payments` takes its idempotency token in the `Idempotency-Key` header or, for the original design's
clients, in the body's `token` (contracts/http-api.md); one of the two is required, and the header wins when
both are sent. OpenAPI has no constraint across a header and a body field, so the document lists both as
optional and says the rule in words. This hook drops the positive cases that break the rule (neither is sent):
they are not valid requests, and the server rightly answers them `400 idempotency_key_missing`. Negative cases
keep them, so a request without any token is still checked to be refused.
"""

import schemathesis


@schemathesis.hook("filter_case").apply_to(method="POST", path="/v1/payments")
def token_in_header_or_body(context, case):
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return True
    in_header = any(name.lower() == "idempotency-key" for name in (case.headers or {}))
    in_body = isinstance(case.body, dict) and case.body.get("token") is not None
    return in_header or in_body
