"""What the client programs' memory scenarios share: device memory taken in chunks until
the client refuses, the `hold MIB` scenario (two processes under one limit), and running
the scenario named on the command line (its JSON result is the last line printed)."""
import json
import sys

MIB = 1 << 20
CHUNK_MIB = 64
MAX_MIB = 64 * 1024           # a client that never refuses stops here


def fill(allocate, refused: type, refusal) -> tuple[list, dict]:
    """allocate(CHUNK_MIB bytes) until it raises `refused`: the chunks and refusal(error)."""
    chunks = []
    while True:
        try:
            chunks.append(allocate(CHUNK_MIB * MIB))
        except refused as e:
            return chunks, refusal(e)
        if len(chunks) * CHUNK_MIB > MAX_MIB:
            return chunks, {"error": None}


def hold(mib: int, allocate, fill_rest) -> dict:
    """Holds mib of allocate(), says so, waits for a line on stdin, then fill_rest()."""
    held = allocate(mib * MIB) if mib else None
    print(json.dumps({"holding_mib": mib}), flush=True)
    sys.stdin.readline()
    chunks, refusal = fill_rest()
    out = {"held_mib": mib, "filled_mib": len(chunks) * CHUNK_MIB, "refusal": refusal}
    del chunks, held
    return out


def run(scenarios: dict) -> None:
    """Runs scenarios[argv[1]] with the integer arguments after it and prints its result."""
    scenario, *args = sys.argv[1:]
    print(json.dumps(scenarios[scenario](*map(int, args))))
