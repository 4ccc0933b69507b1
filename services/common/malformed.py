"""Requests that do not parse are answered INVALID_ARGUMENT, not gRPC's INTERNAL.

gRPC Python answers a request its deserializer cannot parse with INTERNAL ("Exception
deserializing request!"), the code of a server bug, although the caller sent bad bytes.
``MalformedRequests`` (a server interceptor every Braid server installs) wraps each method's
deserializer: bytes that do not parse become a marker, and the method answers INVALID_ARGUMENT
naming itself and the parse error before the servicer sees the request; in a request stream,
the first bad message aborts the call there.
"""

from __future__ import annotations

import grpc


class _Malformed:
    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


class MalformedRequests(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method, parse = handler_call_details.method, handler.request_deserializer

        def deserialize(data: bytes):
            try:
                return parse(data)
            except Exception as err:  # noqa: BLE001 - any parse failure is the caller's bad bytes
                return _Malformed(f"{type(err).__name__}: {err}"[:200])

        def check(item, context):
            if isinstance(item, _Malformed):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request to {method}: {item.error}")
            return item

        def checked_stream(requests, context):
            for item in requests:
                yield check(item, context)

        if handler.unary_unary is not None:
            behavior, kind = handler.unary_unary, "unary_unary"
            wrapped = lambda request, context: behavior(check(request, context), context)  # noqa: E731
        elif handler.unary_stream is not None:
            behavior, kind = handler.unary_stream, "unary_stream"

            def wrapped(request, context):
                yield from behavior(check(request, context), context)
        elif handler.stream_unary is not None:
            behavior, kind = handler.stream_unary, "stream_unary"
            wrapped = lambda requests, context: behavior(checked_stream(requests, context), context)  # noqa: E731
        else:
            behavior, kind = handler.stream_stream, "stream_stream"
            wrapped = lambda requests, context: behavior(checked_stream(requests, context), context)  # noqa: E731
        return handler._replace(request_deserializer=deserialize, **{kind: wrapped})
