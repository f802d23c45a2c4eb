"""The response sender's order under backlog: a request's first response leaves before the
pieces of streams already running (the time to first token must not queue behind them), and
each request's own responses keep their order."""
from tritonformer.backend.responses import first_pieces_first


def _piece(handle, final=False):
    return (handle, {"text_output": handle}, None, final)


def test_first_pieces_jump_the_backlog_and_each_stream_keeps_its_order():
    started: set[int] = set()
    a, b, c = "a", "b", "c"
    assert first_pieces_first([_piece(a), _piece(b)], started) == [_piece(a), _piece(b)]
    batch = [_piece(a), _piece(b), _piece(c), _piece(a, final=True), _piece(c)]
    assert first_pieces_first(batch, started) == [_piece(c), _piece(a), _piece(b), _piece(a, final=True), _piece(c)]
    # a finished: a later request with the same handle object starts over; b and c go on.
    assert first_pieces_first([_piece(b), _piece(a)], started) == [_piece(a), _piece(b)]
    assert started == {id(a), id(b), id(c)}


def test_single_final_responses_keep_their_order():
    started: set[int] = set()
    batch = [_piece(h, final=True) for h in ("x", "y", "z")]
    assert first_pieces_first(batch, started) == batch and not started
