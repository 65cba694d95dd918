"""What the installed pyspark offers: the version differences segstore.spark adapts to.

segstore supports pyspark 4.0 to 4.3 (ECO §0). Every difference is detected from the API itself,
never from the version string, so a backport or a patch release that adds a feature is picked up:

- **Admission control** (4.2+, SPARK-55304): ``latestOffset(start, limit)``, read limits and
  ``SupportsTriggerAvailableNow`` in ``pyspark.sql.streaming.datasource``. Before it the stream
  reader applies ``maxOffsetsPerTrigger`` itself (see :mod:`.stream`).
- **Filter pushdown** (4.1+, SPARK-51271): ``DataSourceReader.pushFilters`` and the ``Filter``
  classes.
- **Arrow stream writer** (4.1+): ``DataSourceStreamArrowWriter``; 4.0's stream writers get Rows.
- **``to_arrow_schema``'s timestamp argument**: 4.2+ take ``timezone=``; 4.0/4.1 take
  ``timestamp_utc=`` (default true). Both give ``timestamp[us, UTC]``.
- **Re-registering a statically registered name** (allowed from 4.1, SPARK-51919): 4.0 raises
  ``DATA_SOURCE_ALREADY_EXISTS`` (handled in :func:`segstore.spark.register`).
"""

from __future__ import annotations

import functools
import inspect

import pyspark
from pyspark.sql.datasource import DataSourceReader

try:
    from pyspark.sql.streaming.datasource import ReadMaxRows as _ReadMaxRows
except ImportError:  # pyspark 4.0 / 4.1
    _ReadMaxRows = None

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamArrowWriter
except ImportError:  # pyspark 4.0
    _StreamArrowWriter = None

PYSPARK_VERSION = pyspark.__version__

#: ``latestOffset(start, limit)`` with read limits and AvailableNow support (4.2+).
ADMISSION_CONTROL = _ReadMaxRows is not None
#: ``DataSourceReader.pushFilters`` (4.1+).
FILTER_PUSHDOWN = hasattr(DataSourceReader, "pushFilters")
#: ``DataSourceStreamArrowWriter`` (4.1+).
STREAM_ARROW_WRITER = _StreamArrowWriter is not None


@functools.lru_cache(maxsize=None)
def _timestamp_utc() -> dict:
    # The keyword that makes TimestampType an Arrow timestamp in UTC, as Spark's data source
    # workers expect it (imported lazily: pyspark.sql.pandas needs pyarrow).
    from pyspark.sql.pandas.types import to_arrow_schema

    params = inspect.signature(to_arrow_schema).parameters
    return {"timezone": "UTC"} if "timezone" in params else {"timestamp_utc": True}


def to_arrow_schema(schema):
    """``pyspark.sql.pandas.types.to_arrow_schema`` with UTC timestamps and 32-bit binary
    offsets, on every supported pyspark."""
    from pyspark.sql.pandas.types import to_arrow_schema as convert

    return convert(schema, **_timestamp_utc())
