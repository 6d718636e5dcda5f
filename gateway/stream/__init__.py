"""A streamed response, from the replica's first read to the client's last
event. One streamed request passes these modules once each, in this order:

    relay         setup (the tap, the headers), the loop over the replica's
                  reads, the ending                         (`relay_stream`)
    taps          what the client is sent of each read, and what the gateway
                  reads out of it (usage, token ids)    (`StreamTap`, `LedgerTap`)
    sse           the one SSE splitter and payload parser (`EventBuffer`, `payload`)
    ledger        what the client was sent, per replica part, and stop
                  strings across a splice                   (`StreamLedger`)
    splice        a broken stream continued on another replica (`continue_stream`)
    continuation  the pure half of that: which requests can be continued,
                  the request that continues one, its output in the client's
                  shape (`contract.wire`'s chunk builders)
    ends          how a stream that cannot go on ends: the in-band error event
                  (and, before any byte, the 503 to retry), shared with the
                  request's outcome stage (`gateway.outcome`)

`shape` holds the request-shape rule (one prompt, one output) that
continuation and capture (`gateway.capture`) share.
"""
