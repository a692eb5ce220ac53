"""An export's choices, each declared once: the table of quantize modes
(`modes.MODES`: each mode's policy), export dtypes and their defaults, and
`ExportOptions` (`export_options`), an export's arguments checked and
resolved once."""
