"""The step stream's wire format: stepColumns bodies and their answers as length-prefixed
frames on one upgraded connection (``GET .../stepStream``, ``Upgrade: mistk-steps``).

Why: over HTTP every env step round trip is a request line and headers written, parsed into
callbacks and checked, and the server's per-request bookkeeping: 50-80 us of a 64-copy
CartPole round trip of about 1 ms on 2 cores (docs/serving.md "The step stream"). A stream
pays for that once, when it opens: the upgrade request carries
what every step's headers would (the token, Content-Type and Accept of the frames), and the
service checks it then as it checks a request. After its ``101 Switching Protocols`` answer
the connection carries only frames, each answered in the order sent (so two may be in
flight, as with HTTP pipelining), through the same pipeline as a stepColumns request
(`ServicePipeline.answer_now`: the body's limit, decoding, the spec's checks, the handler, the
rendering of the answer or of a problem). This is SEED RL's and gRPC's streaming step
channel, on the services' own HTTP/1.1 port.

    request frame: [u32 body length] [body: a stepColumns body, the stream's Content-Type]
    answer frame:  [u16 status] [u8 content type, an index into CONTENT_TYPES]
                   [u32 payload length] [payload: the answer, or a problem+json]

All little endian. The caller sends its first frame once the ``101`` is read (what comes
with the upgrade request is not read). A frame longer than the service's body limit is
answered with a 413 problem and the stream closes (the rest of it is not read); a problem
answer to a frame leaves the stream open, as a 4xx leaves a kept-alive HTTP connection open.
"""

from __future__ import annotations

import struct

PROTOCOL = "mistk-steps"  # the Upgrade token
PATH = "/stepStream"  # under the agent's base path
FRAMES_OF = "/stepColumns"  # the operation each frame is
REQUEST_HEAD = struct.Struct("<I")
ANSWER_HEAD = struct.Struct("<HBI")
CONTENT_TYPES = ("application/json", "application/vnd.mistk.tensors", "application/problem+json")


# an answer's Content-Type (as the pipeline names it) -> its code in an answer frame
CONTENT_CODES = {name.encode("latin-1"): code for code, name in enumerate(CONTENT_TYPES)}
