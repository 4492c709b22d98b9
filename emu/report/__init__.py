"""Self-contained HTML pages (inline SVG and CSS, no script, nothing fetched) for the commands'
results: html.py is the page shell, svg.py the figure primitives, one module per page kind."""
