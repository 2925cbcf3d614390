"""`naiad analyze`: Model Analyzer's config search (brute / quick) with constraints, objectives and a report."""
