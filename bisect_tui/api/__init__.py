"""The contract between core and the engines: imported by both, importing nothing of ours."""
