"""tinyelectra: pre-train ELECTRA-Small within a budget on one GPU and measure what each slice buys on GLUE."""

__version__ = "0.1.0"
