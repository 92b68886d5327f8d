"""Wire protocol v1 as code: the contract clients and outside tests rely on
(docs/protocol.md is its prose form).

- `wire.codes`       protocol version, sample rates, close codes, error codes, encodings
- `wire.errors`      ProtocolError: bad input, with its error code and close code
- `wire.messages`    every server → client message type, and `Final` (a parsed final)
- `wire.build`       the one builder of every server → client message, and `encode`
- `wire.control`     client → server JSON frames: control messages and `auth`
- `wire.query`       id validation and the stream socket's query parameters
- `wire.transcript`  a meeting's finals rendered as JSON, text, SRT or WebVTT

wire imports no other package of the project: the server, the sessions and any client
(loadgen speaks nothing else) all build on it.
"""
