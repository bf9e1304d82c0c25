"""The book's helpers: what the notebooks call to read records, draw figures and run live experiments.
They use the measuring tools and the library; nothing outside this folder imports them."""
