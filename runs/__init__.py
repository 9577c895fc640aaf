"""The run model and its detectors: incarnations, cursor and dedupe (model), findings and
the detectors that raise them, the reference CE. Below the sources and the stores; imports
only steptail.parsers."""
