"""The one way genready writes HTML (htmlpage) and what its pages are made of: the stylesheets and the
status page's script, package data files beside this one."""
