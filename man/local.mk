# filled by the man pages author
