/* The static musl build links the distribution's libseccomp.a, compiled against glibc with
 * _FORTIFY_SOURCE: its PFC export calls glibc's checked fprintf. musl has no checked variants;
 * this one is the plain fprintf (the checks are compile-time hardening, not behaviour). */
#include <stdarg.h>
#include <stdio.h>

int __fprintf_chk(FILE *stream, int flag, const char *format, ...)
{
	va_list ap;
	int n;

	(void)flag;
	va_start(ap, format);
	n = vfprintf(stream, format, ap);
	va_end(ap);
	return n;
}
