"""Order statistics the benchmarks report."""


def percentile(values, q):
    """The q-th percentile (0..100) of `values`, the nearest sample by rank."""
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]
