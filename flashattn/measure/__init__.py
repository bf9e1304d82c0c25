"""Measuring tools: timing, the benchmark, the profiler and its report readers, the compiler's and the
machine code's views, the sweeps and the tables. They use the library (`flashattn`), never the book's helpers."""
