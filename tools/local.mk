# filled by the tools author
