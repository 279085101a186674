"""`tandem serve`: a local OpenAI-compatible HTTP server over one loaded pair.

    command.py      `tandem serve`: the loaded pair served by uvicorn
    app.py          the routes (Starlette): /v1/chat/completions, /v1/completions, /v1/models, /health
    requests.py     a request's JSON read into a CompletionRequest, every value checked
    responses.py    OpenAI's response and stream-chunk shapes, with the engine's figures as `timings`
    work_queue.py   one worker thread that runs every generation, in arrival order
    pair_host.py    the loaded pair, and the saved pairs a request's `model` can switch to
    stop_strings.py the request's `stop` strings, held back and cut as text streams
    limits.py       what one request may ask for
    api_errors.py   the OpenAI-style error every refusal is sent as
"""
