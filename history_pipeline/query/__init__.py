"""Time-travel queries: choosing files, reconstructing tables as of T, and DuckDB SQL."""
