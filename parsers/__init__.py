"""Pure parsers: bytes of one log line in, one typed record (or nothing) out. No I/O."""

from steptail.parsers.line import MAX_LINE, TAGS, parse_line, parse_message
from steptail.parsers.records import (
    Checkpoint,
    ConfigParam,
    LossParts,
    Malformed,
    ParsedLine,
    PodStep,
    Record,
    RequiredRbf,
    TrainerStart,
)
from steptail.parsers.scan import candidate_lines, has_tag
from steptail.parsers.timestamps import format_ns, parse_rfc3339, split_timestamp

__all__ = [
    "MAX_LINE", "TAGS", "Checkpoint", "ConfigParam", "LossParts", "Malformed", "ParsedLine",
    "PodStep", "Record", "RequiredRbf", "TrainerStart", "candidate_lines", "format_ns",
    "has_tag", "parse_line", "parse_message", "parse_rfc3339", "split_timestamp",
]
